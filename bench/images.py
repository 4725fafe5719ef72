"""`sudo /opt/tfdeploy/venv/bin/python -m bench.images [--hosts 16] [--mb 200] [--top-mb 5]
[--rate 100mbit] [--out docs/bench/images.md]`

A job's container image sent from this machine (`image_from = "controller"`) to N container lab
hosts whose image stores never held it, the uplink capped at --rate (tbf on the lab's bridge:
this machine -> lab only, checked by measurement first), against a star copy. The image is built
here: the busybox test image plus one layer of --mb MB of random (incompressible) bytes.

Arms, one after the other in one run (one repetition each: the star alone moves N times the
image through the capped uplink):
  star             the image saved here once (`podman save`), the archive copied to every host
                   in parallel (`ssh host 'cat > F'`), then loaded there in parallel
                   (`ssh host podman load -i F`). The issue's `podman save | ssh host podman
                   load` overlaps the load with the copy; split, the time until every host holds
                   the image and the load get columns of their own.
  tfdeploy cold    `tfdeploy up --detach` (the image saved here, its blobs through the content
                   store and the fan-out, loaded on each host), then `down`; no host has the
                   image or a workdir, and this machine has no saved layout.
  tfdeploy warm    the same `up` again: every host holds the image.
  tfdeploy changed an image with one more small layer (--top-mb MB of random bytes) on top.

Columns: "held" is the time until every host holds the image's bytes (star: save + copy;
tfdeploy: from the command's start to its "pushed" line, preflight and the save here included);
"load" is the loading into the hosts' stores (star: the parallel loads; tfdeploy: from "pushed"
to "image loaded"): N loads share this machine's cores, so it is its own column. "total" is the
whole command (tfdeploy: `up --detach` to its return, tasks started). Uplink bytes are what this
machine sent into the lab during the arm (tx_bytes of the lab's bridge: frames and SSH included).
After each arm every host is checked to hold the image.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import report
from bench.__main__ import _fmt_bytes
from bench.fanout import check_cap
from bench.report import tee_to
from bench.tools import BenchError, make_tmp
from tests.lab import Lab, LabHost, start_lab
from tests.lab import containers as lab_containers

ARCHIVE = "/root/bench-image.tar"
WORKDIR = "/root/.tfdeploy"
TIMEOUT = 1800.0


@dataclass(frozen=True)
class Arm:
    name: str
    held: float  # seconds until every host holds the image's bytes
    load: float | None  # seconds of loading into the hosts' stores (None: nothing loaded)
    total: float
    uplink: int  # bytes this machine sent into the lab


def parallel(fn: Callable[[LabHost], object], hosts: list[LabHost]) -> list[object]:
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        return list(pool.map(fn, hosts))


def podman_here(*args: str) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise BenchError(f"podman {args[0]} failed here: {done.stderr.strip()[-500:]}")
    return done.stdout


def build_image(tmp: Path, base: str, name: str, mb: int, seed: int) -> None:
    """`base` plus one layer of `mb` MB of random bytes, as `name`."""
    ctx = tmp / f"ctx-{seed}"
    ctx.mkdir()
    rnd = random.Random(seed)
    with (ctx / "data.bin").open("wb") as f:
        for _ in range(mb):
            f.write(rnd.randbytes(1_000_000))
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY data.bin /data-{seed}.bin\n")
    podman_here("build", "-q", "-t", name, str(ctx))
    shutil.rmtree(ctx)


class Bench:
    def __init__(self, lab: Lab, tmp: Path, hosts: list[LabHost]) -> None:
        self.lab, self.tmp, self.hosts = lab, tmp, hosts

    def reset(self) -> None:
        """Untimed: no image, archive, workdir or container of a run on any host."""

        def one(h: LabHost) -> None:
            self.lab.podman(h, "rm -af", timeout=300)  # type: ignore[attr-defined]
            self.lab.podman(h, "rmi -af", timeout=300)  # type: ignore[attr-defined]
            self.lab.run(h, f"rm -rf {WORKDIR} {ARCHIVE}", timeout=120)

        parallel(one, self.hosts)

    def check_held(self, image: str) -> None:
        def one(h: LabHost) -> str | None:
            done = self.lab.podman(h, f"image exists {image}")  # type: ignore[attr-defined]
            return None if done.returncode == 0 else h.name

        missing = [m for m in parallel(one, self.hosts) if m]
        if missing:
            raise BenchError(f"{image} is not on {', '.join(map(str, missing))}")

    def star(self, image: str) -> Arm:
        before = self.lab.uplink_bytes()
        began = time.monotonic()
        tar = self.tmp / "image.tar"
        tar.unlink(missing_ok=True)
        podman_here("save", "-o", str(tar), image)
        self._on_hosts(
            lambda h: [
                "sh",
                "-c",
                f"ssh -F {self.lab.ssh_config} {h.name} 'cat > {ARCHIVE}' < {tar}",
            ]
        )
        held = time.monotonic() - began
        self._on_hosts(
            lambda h: [
                "ssh",
                "-F",
                str(self.lab.ssh_config),
                h.name,
                f"podman load -q -i {ARCHIVE}",
            ]
        )
        total = time.monotonic() - began
        tar.unlink()
        return Arm("star", held, total - held, total, self.lab.uplink_bytes() - before)

    def _on_hosts(self, argv: Callable[[LabHost], list[str]]) -> None:
        procs = [
            subprocess.Popen(argv(h), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for h in self.hosts
        ]
        failed = []
        for h, p in zip(self.hosts, procs, strict=True):
            _, err = p.communicate(timeout=TIMEOUT)
            if p.returncode != 0:
                failed.append(f"{h.name} (exit {p.returncode}): {err.strip()[-300:]}")
        if failed:
            raise BenchError("star copy failed on " + "; ".join(failed))

    def tfdeploy(self, name: str, image: str, state: Path) -> Arm:
        inventory = self.lab.write_inventory(
            self.tmp / "inventory.toml",
            tasks=[[{"role": "worker"}]] * len(self.hosts),
            hosts=self.hosts,
            job={
                "code": str(self.tmp / "code"),
                "name": "imagebench",
                "image": image,
                "image_from": "controller",
                "command": "sleep 3600",
                "require_tensorflow": False,
                "stop_grace": 1,
            },
        )
        env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
        before = self.lab.uplink_bytes()
        lines = _timed_lines(
            [sys.executable, "-m", "deployer", "up", "--detach", str(inventory)], env
        )
        uplink = self.lab.uplink_bytes() - before
        total = lines[-1][0] if lines else 0.0
        out = "".join(line for _, line in lines)
        pushed = next((t for t, line in lines if line.startswith("tfdeploy: pushed")), None)
        loaded = next((t for t, line in lines if line.startswith("tfdeploy: image loaded")), None)
        down = subprocess.run(
            [sys.executable, "-m", "deployer", "down", str(inventory)],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
        )
        if pushed is None or down.returncode != 0:
            raise BenchError(f"tfdeploy failed:\n{out[-1500:]}{down.stdout[-500:]}{down.stderr}")
        if name == "tfdeploy warm" and loaded is not None:
            raise BenchError(f"the warm re-deploy loaded the image again:\n{out[-1500:]}")
        load = None if loaded is None else loaded - pushed
        return Arm(name, pushed, load, total, uplink)


def _timed_lines(argv: list[str], env: dict[str, str]) -> list[tuple[float, str]]:
    """The command's output lines, each with the seconds since its start; the last entry is
    (its end, "")."""
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    timer = threading.Timer(TIMEOUT, proc.kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - began, line))
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode != 0:
        tail = "".join(line for _, line in lines)[-1500:]
        raise BenchError(f"tfdeploy up failed (exit {proc.returncode}):\n{tail}")
    return [*lines, (time.monotonic() - began, "")]


def table(arms: list[Arm], image_bytes: int, layer_bytes: int) -> str:
    star = next(a for a in arms if a.name == "star")
    head = ["arm", "held", "held ÷ star's", "load", "total", "uplink bytes", "÷ image", "÷ layer"]
    rows = [head, ["---"] * len(head)]
    for a in arms:
        load = "-" if a.load is None else f"{a.load:.1f} s"
        rows.append(
            [
                a.name,
                f"{a.held:.1f} s",
                f"{a.held / star.held:.3f}x",
                load,
                f"{a.total:.1f} s",
                _fmt_bytes(a.uplink),
                f"{a.uplink / image_bytes:.3f}x",
                f"{a.uplink / layer_bytes:.2f}x" if a.name == "tfdeploy changed" else "-",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hosts", type=int, default=16, help="container lab hosts (16)")
    p.add_argument("--mb", type=int, default=200, help="the image's big layer, MB (200)")
    p.add_argument("--top-mb", type=int, default=5, help="the changed image's new layer (5)")
    p.add_argument("--rate", default="100mbit", help="the capped uplink, as tc says it")
    p.add_argument("--out", type=Path, help="also write the output to this file (docs/bench/)")
    args = p.parse_args()
    with tee_to(args.out, "bench.images"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print(f"the bench needs root (namespace lab): sudo {sys.executable} -m bench.images")
        return 2
    reason = lab_containers.available()
    if reason is not None:
        raise BenchError(reason)
    started = time.monotonic()
    load_before = report.load()
    tmp = make_tmp()
    (tmp / "code").mkdir()
    tag = f"{os.getpid()}"
    base, big, changed = (f"localhost/tfdeploy-bench/{n}:{tag}" for n in ("base", "big", "top"))
    lab = None
    try:
        lab = start_lab(args.hosts, containers=True)
        os.environ["CONTAINERS_CONF"] = str(lab.dir / "containers.conf")
        podman_here("import", "-q", str(lab_containers.test_image_tar()), base)
        build_image(tmp, base, big, args.mb, 1)
        build_image(tmp, big, changed, args.top_mb, 2)
        lab.cap_uplink(args.rate)
        cap = check_cap(lab, args.rate)
        _log(started, f"lab of {args.hosts} up, images built; {cap}")
        bench = Bench(lab, tmp, lab.hosts[: args.hosts])
        arms = []
        bench.reset()
        arms.append(bench.star(big))
        bench.check_held(big)
        _log(started, f"{arms[-1]}")
        bench.reset()
        for name, image in (
            ("tfdeploy cold", big),
            ("tfdeploy warm", big),
            ("tfdeploy changed", changed),
        ):
            arms.append(bench.tfdeploy(name, image, tmp / "state"))
            bench.check_held(image)
            _log(started, f"{arms[-1]}")
        image_bytes = _layout_bytes(tmp / "state", big)
        layer_bytes = _layout_bytes(tmp / "state", changed) - image_bytes
        archive = int(podman_here("image", "inspect", "--format", "{{.Size}}", big))
        bench.reset()
    finally:
        if lab is not None:
            try:
                lab.uncap_uplink()
            finally:
                lab.stop()
        subprocess.run(["podman", "rmi", "-f", changed, big, base], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.hosts
    print(f"### A {_fmt_bytes(image_bytes)} image to {n} hosts, uplink capped at {args.rate}\n")
    print(table(arms, image_bytes, layer_bytes))
    print(
        f"\nThe image: the busybox test image plus a layer of {args.mb} MB of random bytes, "
        f"{_fmt_bytes(image_bytes)} as its OCI layout's blobs (gzip-compressed layers; "
        f"{_fmt_bytes(archive)} unpacked); the changed image adds a layer of {args.top_mb} MB, "
        f"{_fmt_bytes(layer_bytes)} of new blobs (layer, config, manifest). "
        "Ratios: uplink bytes ÷ the image's blob bytes, ÷ the changed image's new blob bytes."
    )
    print(f"\nCap checked before the runs: {cap}.")
    print(
        f"\nMachine: {report.machine()}. Load average before/after: {load_before} / "
        f"{report.load()}. Bench wall time {(time.monotonic() - started) / 60:.1f} min; one "
        "repetition per arm (the star alone moves every host's copy through the cap)."
    )
    return 0


def _layout_bytes(state: Path, image: str) -> int:
    """The bytes of the image's blobs in the OCI layout tfdeploy saved here."""
    image_id = podman_here("image", "inspect", "--format", "{{.Id}}", image).strip()
    layout = state / "images" / image_id
    if not layout.is_dir():
        found = [d for d in (state / "images").glob(f"{image_id[:12]}*") if d.is_dir()]
        if not found:
            raise BenchError(f"no saved layout of {image} under {state / 'images'}")
        layout = found[0]
    return sum(f.stat().st_size for f in (layout / "blobs").rglob("*") if f.is_file())


def _log(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:5.0f} s] {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted: the lab is stopped", file=sys.stderr)
        sys.exit(130)
