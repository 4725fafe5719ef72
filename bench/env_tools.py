"""`python -m bench.env_tools [--sets small,sklearn,tf] [--reps 2] [--out docs/bench/env_tools.md]`

pip against uv for the two halves of a job's environment, on this machine, side by side:

- resolve (+ download): the wheels of a requirement set for a target Python and platform, as the
  controller must fetch them for its hosts: `pip download --only-binary=:all: --python-version
  --platform` (the baseline); `pip install --dry-run --report` (pip resolving alone, metadata
  only); `uv pip compile --python-version --python-platform` (uv resolving alone: uv has no
  `download`, so its wheels still come from `pip download --no-deps` of the pinned list, the
  fourth arm). Each run starts with empty caches (pip `--no-cache-dir`, a new `UV_CACHE_DIR`).
- install: a fresh venv from that wheelhouse, offline: `pip install --no-index --find-links`
  (the baseline) against `uv pip install --offline --no-index --find-links` with an empty uv cache
  and with a warm one (uv hard-links from its cache).

uv does not read pip's configuration, so its arms get this machine's pip settings translated
(index, extra indexes, find-links, constraints) and `--index-strategy unsafe-best-match`, pip's
own way of treating several indexes; without it uv takes a package only from the first index
that has it. Arms alternate within each repetition (the machine is shared); medians, then
(min-max). Needs the network (the package index), no lab, no root. uv comes from `--uv`
(default: `uv` on PATH).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from bench import report
from bench.tools import BenchError, make_tmp

SETS = {
    "small": ["six", "packaging", "attrs"],
    "sklearn": ["scikit-learn"],
    "tf": ["tensorflow-cpu==2.21.0", "scikit-learn"],
}
TARGET_PY = "3.11"
# The platform tags of a glibc 2.28 x86_64 host (what deployer/envs/platform.py derives).
TARGET_TAGS = [f"manylinux_2_{x}_x86_64" for x in range(28, 16, -1)] + ["manylinux2014_x86_64"]
UV_TARGET = "x86_64-manylinux_2_28"


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise BenchError(
            f"{argv[:4]} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-1500:]}"
        )
    return time.monotonic() - t0


def _pip_settings() -> dict[str, list[str]]:
    """This machine's pip configuration (`pip config list`, PIP_* included), key -> values."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.split(".", 1)[-1]
        settings[name] = value.strip("'\"").split()
    return settings


def _uv_index_args(settings: dict[str, list[str]]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for key, flag in (
        ("index-url", "--index-url"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("constraint", "--constraint"),
    ):
        for value in settings.get(key, []):
            args += [flag, value]
    return args


class Arms:
    """Every arm of one requirement set, each a function of a fresh folder -> seconds."""

    def __init__(self, tmp: Path, uv: str, reqs: list[str]) -> None:
        self.tmp, self.uv, self.reqs = tmp, uv, reqs
        self.pip = [sys.executable, "-m", "pip"]
        self.uv_index = _uv_index_args(_pip_settings())
        self.target = [
            "--python-version",
            TARGET_PY,
            *(a for t in TARGET_TAGS for a in ("--platform", t)),
        ]
        self.wheelhouse = tmp / "wheelhouse"
        self.warm_cache = tmp / "uv-warm"

    def _uv_env(self, cache: Path) -> dict[str, str]:
        return os.environ | {"UV_CACHE_DIR": str(cache)}

    def pip_download(self, d: Path) -> float:
        argv = [*self.pip, "download", "-q", "--no-cache-dir", "--only-binary=:all:", *self.target]
        return _timed([*argv, "-d", str(d / "wh"), *self.reqs])

    def pip_report(self, d: Path) -> float:
        argv = [*self.pip, "install", "-q", "--no-cache-dir", "--dry-run", "--ignore-installed"]
        argv += ["--only-binary=:all:", *self.target, "--target", str(d / "t")]
        return _timed([*argv, "--report", str(d / "report.json"), *self.reqs])

    def _uv_compile(self, d: Path) -> float:
        (d / "in.txt").write_text("\n".join(self.reqs) + "\n")
        argv = [self.uv, "pip", "compile", "-q", "--python-version", TARGET_PY]
        argv += ["--python-platform", UV_TARGET, "--only-binary", ":all:", *self.uv_index]
        argv += ["-o", str(d / "pinned.txt"), str(d / "in.txt")]
        return _timed(argv, self._uv_env(d / "uv-cache"))

    def uv_compile(self, d: Path) -> float:
        return self._uv_compile(d)

    def uv_compile_pip_download(self, d: Path) -> float:
        seconds = self._uv_compile(d)
        argv = [*self.pip, "download", "-q", "--no-cache-dir", "--no-deps", "--only-binary=:all:"]
        argv += [*self.target, "-d", str(d / "wh"), "-r", str(d / "pinned.txt")]
        return seconds + _timed(argv)

    def _venv(self, d: Path) -> Path:
        subprocess.run([sys.executable, "-m", "venv", str(d / "venv")], check=True)  # untimed
        return d / "venv" / "bin" / "python"

    def pip_install(self, d: Path) -> float:
        py = self._venv(d)
        argv = [str(py), "-m", "pip", "install", "-q", "--no-index"]
        return _timed([*argv, "--find-links", str(self.wheelhouse), *self.reqs])

    def _uv_install(self, d: Path, cache: Path) -> float:
        py = self._venv(d)
        argv = [self.uv, "pip", "install", "-q", "--offline", "--no-index", "--python", str(py)]
        return _timed(
            [*argv, "--find-links", str(self.wheelhouse), *self.reqs], self._uv_env(cache)
        )

    def uv_install_cold(self, d: Path) -> float:
        return self._uv_install(d, d / "uv-cache")

    def uv_install_warm(self, d: Path) -> float:
        return self._uv_install(d, self.warm_cache)

    def prepare(self) -> None:
        """Untimed: the wheelhouse the install arms read, and uv's warm cache."""
        self.pip_download(self.tmp)
        shutil.move(self.tmp / "wh", self.wheelhouse)
        self._uv_install(self.tmp / "warmup", self.warm_cache)


RESOLVE = [
    ("pip download (resolve + download)", "pip_download"),
    ("pip install --dry-run --report (resolve only)", "pip_report"),
    ("uv pip compile (resolve only)", "uv_compile"),
    ("uv pip compile + pip download --no-deps", "uv_compile_pip_download"),
]
INSTALL = [
    ("pip install --no-index", "pip_install"),
    ("uv pip install --offline, cold uv cache", "uv_install_cold"),
    ("uv pip install --offline, warm uv cache", "uv_install_warm"),
]


def measure(arms: Arms, reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for rep in range(reps):
        for _, name in RESOLVE + INSTALL:
            d = arms.tmp / f"{name}-{rep}"
            d.mkdir()
            fn: Callable[[Path], float] = getattr(arms, name)
            times[name].append(fn(d))
            shutil.rmtree(d, ignore_errors=True)
    return times


def _wheelhouse_line(wh: Path) -> str:
    wheels = list(wh.glob("*.whl"))
    mb = sum(w.stat().st_size for w in wheels) / 1e6
    return f"{len(wheels)} wheels, {mb:.1f} MB"


def _print_set(arms: Arms, times: dict[str, list[float]], wheelhouse: str) -> None:
    print(f"\n### `{' '.join(arms.reqs)}` ({wheelhouse})\n")
    print("| arm | seconds, median (min-max) | ÷ baseline |")
    print("|---|---|---|")
    for rows in (RESOLVE, INSTALL):
        base = statistics.median(times[rows[0][1]])
        for text, name in rows:
            t = times[name]
            med = statistics.median(t)
            print(f"| {text} | {med:.2f} ({min(t):.2f}-{max(t):.2f}) | {med / base:.2f}x |")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.env_tools", description=__doc__)
    p.add_argument("--sets", default="small,sklearn")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tf-reps", type=int, default=1)
    p.add_argument("--uv", default=shutil.which("uv") or "uv")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    uv_version = subprocess.run([args.uv, "--version"], capture_output=True, text=True).stdout
    pip_version = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True
    ).stdout
    results = []
    for label in args.sets.split(","):
        tmp = make_tmp()
        try:
            arms = Arms(tmp, args.uv, SETS[label])
            arms.prepare()
            wheelhouse = _wheelhouse_line(arms.wheelhouse)
            times = measure(arms, args.tf_reps if label == "tf" else args.reps)
            results.append((label, arms, times, wheelhouse))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    with report.tee_to(args.out, "bench.env_tools"):
        print(
            f"pip against uv for a job's environment, target CPython {TARGET_PY} on "
            f"{UV_TARGET}; {pip_version.split(' from ')[0]}, {uv_version.strip()}; "
            f"{report.machine()}; load average {report.load()} (the cores are shared: arms "
            f"alternate within each repetition). Resolve arms start with empty caches.\n"
        )
        for _, arms, times, wheelhouse in results:
            _print_set(arms, times, wheelhouse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
