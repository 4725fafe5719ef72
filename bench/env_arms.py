"""The arms of bench.env: a job's Python environment from nothing to every worker's first step,
by hand (pip download, parallel rsync, pip install --no-index on each host) and by tfdeploy (the
job's `requirements`), on lab hosts with no route out.

Each arm returns a Sample: its phases as seconds from the arm's start, the bytes this machine
sent into the lab, and the peak RSS of the largest process it ran on this machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.dataplane import machine_busy
from bench.tools import BenchError
from tests.lab import Lab, LabHost

TIMEOUT = 1800.0
T = TypeVar("T")
HAND_DIR = "/root/bench-env"  # by hand: the wheelhouse, the code and the venv on each host
SCP_DIR = "/root/bench-env-scp"
WORKDIR = "/root/.tfdeploy"
TF_PORT = 2222
RUNNING = "tfdeploy-env"  # the first line every program prints: the task runs
FIRST_STEP = "first step done"  # after its first training step (examples/digits/mwms.py too)
# No host reads this machine's pip configuration (the lab shares /etc with it, where a real
# host would have none): by hand, pip on the hosts sees only what the command line gives it.
HOST_PIP_ENV = "PIP_CONFIG_FILE=/dev/null"


@dataclass
class Sample:
    """One arm's run. Phase ends are seconds from the arm's start; None where not seen."""

    phases: dict[str, float] = field(default_factory=dict)  # resolve, send, install, running, first
    uplink: int = 0
    rss_kb: int = 0  # the largest process this arm ran on this machine
    reinstalled: bool | None = None  # tfdeploy: its output said it built a venv
    installer: str = ""  # tfdeploy: the installer its output named (uv or pip)
    busy_first: float | None = None  # this machine's busy CPU seconds until the first step


class BusyTrace:
    """This machine's busy CPU seconds, all cores (bench.dataplane.machine_busy), sampled every
    STEP_S from an arm's start, so `at(t)` is what the arm's work had cost the cores t seconds
    in. The lab's hosts share these cores: busy core-seconds over the core count bound an arm's
    wall time from below, whichever way it spreads its work."""

    STEP_S = 0.25

    def __init__(self, began: float) -> None:
        self.began = began
        self.samples = [(0.0, machine_busy())]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(self.STEP_S):
            self.samples.append((time.monotonic() - self.began, machine_busy()))

    def __enter__(self) -> BusyTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def at(self, t: float | None) -> float | None:
        """Busy seconds from the start to the last sample at or before `t`."""
        if t is None:
            return None
        seen = [busy for when, busy in self.samples if when <= t]
        return seen[-1] - self.samples[0][1]


@dataclass
class Proc:
    returncode: int
    lines: list[tuple[float, str]]  # (seconds since the arm began, line)
    rss_kb: int


def run(
    argv: Sequence[str],
    began: float,
    *,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
    what: str = "",
    check: bool = True,
) -> Proc:
    """Runs `argv`, each output line stamped as it comes; peak RSS from wait4 (this process)."""
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    own = _PeakRss(proc.pid)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - began, line.rstrip("\n")))
        own.stop()
        _, status, _ = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        timer.cancel()
        own.stop()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    done = Proc(proc.returncode, lines, own.peak_kb)
    if check and done.returncode != 0:
        tail = "\n".join(line for _, line in lines)[-1500:]
        raise BenchError(f"{what or argv[0]} failed (exit {done.returncode}):\n{tail}")
    return done


class _PeakRss:
    """The process's own peak RSS (VmHWM), read while it lives: wait4's figure would include
    the children it waited for (pip), and tfdeploy's own footprint is the one that matters."""

    def __init__(self, pid: int) -> None:
        self.path = Path(f"/proc/{pid}/status")
        self.peak_kb = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            text = self.path.read_text()
        except OSError:
            return
        m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
        if m:
            self.peak_kb = max(self.peak_kb, int(m.group(1)))

    def _poll(self) -> None:
        while not self._done.wait(0.1):
            self._read()

    def stop(self) -> None:
        if not self._done.is_set():
            self._read()  # the output has ended; the process is still there (not yet waited)
            self._done.set()
            self._thread.join()


def parallel(fn: Callable[[LabHost], T], hosts: list[LabHost]) -> list[T]:
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        return list(pool.map(fn, hosts))


def on_all(lab: Lab, hosts: list[LabHost], command: str) -> None:
    """Untimed housekeeping inside every host (nsenter, no SSH)."""

    def one(h: LabHost) -> None:
        done = lab.run(h, command, timeout=300)
        if done.returncode != 0:
            raise BenchError(f"{h.name}: {command!r} failed: {done.stderr.strip()[-300:]}")

    parallel(one, hosts)


def wheelhouse_bytes(wh: Path) -> int:
    return sum(w.stat().st_size for w in wh.glob("*.whl"))


def pip_download(requirements: Path, dest: Path, began: float) -> Proc:
    """What the user runs here, once: the wheels of the requirements (this machine's platform is
    the hosts' in the lab) with this machine's pip configuration."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    return run([*argv, "-d", str(dest), "-r", str(requirements)], began, what="pip download")


def tf_config(hosts: list[LabHost], index: int) -> str:
    workers = [f"{h.address}:{TF_PORT}" for h in hosts]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


class Arms:
    def __init__(self, lab: Lab, tmp: Path, code: Path, command: str, tf: bool) -> None:
        self.lab, self.tmp, self.code, self.command, self.tf = lab, tmp, code, command, tf
        self.per_host: dict[str, dict[str, object]] = {}  # keys of some hosts' entries
        self.last_output: list[tuple[float, str]] = []  # the last `tfdeploy up`'s lines
        self.ssh = f"ssh -F {lab.ssh_config}"

    # -- by hand ----------------------------------------------------------------------------------

    def by_hand(self, hosts: list[LabHost]) -> Sample:
        """pip download here, rsync the wheelhouse and code to every host at once, pip install
        --no-index on every host at once, then start every task over SSH."""
        on_all(self.lab, hosts, f"rm -rf {HAND_DIR}")
        wh = self.tmp / "hand-wheels"
        shutil.rmtree(wh, ignore_errors=True)
        s = Sample()
        before = self.lab.uplink_bytes()
        began = time.monotonic()
        with BusyTrace(began) as trace:
            procs = [pip_download(self.code / "requirements.txt", wh, began)]
            s.phases["resolve"] = time.monotonic() - began
            procs += self._all(hosts, began, self._rsync_argv(wh), "rsync")
            s.phases["send"] = time.monotonic() - began
            procs += self._all(hosts, began, self._install_argv, "pip install")
            s.phases["install"] = time.monotonic() - began
            starts = self._all(hosts, began, self._start_argv(hosts), "the task")
        s.uplink = self.lab.uplink_bytes() - before
        s.phases.update(task_marks([p.lines for p in starts], len(hosts)))
        s.rss_kb = max(p.rss_kb for p in procs + starts)
        s.busy_first = trace.at(s.phases.get("first"))
        on_all(self.lab, hosts, f"rm -rf {HAND_DIR}")  # the lab's disk is memory
        return s

    def _all(
        self, hosts: list[LabHost], began: float, argv: Callable[[LabHost], list[str]], what: str
    ) -> list[Proc]:
        return parallel(lambda h: run(argv(h), began, what=f"{what} on {h.name}"), hosts)

    def _rsync_argv(self, wh: Path) -> Callable[[LabHost], list[str]]:
        def argv(h: LabHost) -> list[str]:
            return [
                "rsync",
                "-a",
                "-e",
                self.ssh,
                f"{wh}/",
                f"{self.code}/",
                f"{h.name}:{HAND_DIR}/",
            ]

        return argv

    def _install_argv(self, h: LabHost) -> list[str]:
        venv = f"{HAND_DIR}/venv"
        script = (
            f"{self.lab.python} -m venv {venv} && {HOST_PIP_ENV} {venv}/bin/python -m pip install"
            f" -q --no-index --find-links {HAND_DIR} -r {HAND_DIR}/requirements.txt"
        )
        return [*self.lab.ssh_argv(h, script)]

    def _start_argv(self, hosts: list[LabHost]) -> Callable[[LabHost], list[str]]:
        def argv(h: LabHost) -> list[str]:
            i = hosts.index(h)
            env = f"TF_CONFIG='{tf_config(hosts, i)}' TFDEPLOY_TASK=worker:{i}"
            env += f" PATH={HAND_DIR}/venv/bin:$PATH"
            return self.lab.ssh_argv(h, f"cd {HAND_DIR} && {env} exec {self.command}")

        return argv

    # -- one uplink copy --------------------------------------------------------------------------

    def one_copy(self, host: LabHost, wh: Path) -> float:
        """One `scp -r` of the wheelhouse to one host: what the uplink allows for it."""
        on_all(self.lab, [host], f"rm -rf {SCP_DIR}")
        began = time.monotonic()
        argv = ["scp", "-q", "-r", "-F", str(self.lab.ssh_config), str(wh)]
        run([*argv, f"{host.name}:{SCP_DIR}"], began, what="scp")
        seconds = time.monotonic() - began
        on_all(self.lab, [host], f"rm -rf {SCP_DIR}")
        return seconds

    # -- tfdeploy ---------------------------------------------------------------------------------

    def inventory(
        self,
        hosts: list[LabHost],
        name: str,
        *,
        requirements: str | None,
        installer: str | None = None,
    ) -> Path:
        job: dict[str, object] = {
            "code": str(self.code),
            "name": "envbench",
            "command": self.command,
            "require_tensorflow": self.tf,
        }
        if requirements:
            job["requirements"] = requirements
        if installer:
            job["installer"] = installer
        # Without requirements the job runs in the lab's own venv (/opt: every host sees it),
        # which holds every set's packages: the same job on hosts that already have them.
        return self.lab.write_inventory(
            self.tmp / f"{name}.toml",
            tasks=[[{"role": "worker"}]] * len(hosts),
            hosts=hosts,
            job=job,
            per_host=self.per_host,
        )

    def reset_tfdeploy(self, hosts: list[LabHost]) -> None:
        on_all(self.lab, hosts, f"rm -rf {WORKDIR}")

    def tfdeploy(self, inventory: Path, hosts: list[LabHost], state: Path) -> Sample:
        """`tfdeploy up` (attached, plain lines) until the job ends; phases from its lines."""
        s = Sample()
        before = self.lab.uplink_bytes()
        began = time.monotonic()
        env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
        argv = [sys.executable, "-m", "deployer", "up", str(inventory)]
        with BusyTrace(began) as trace:
            done = run(argv, began, env=env, what="tfdeploy up")
        s.uplink = self.lab.uplink_bytes() - before
        s.rss_kb = done.rss_kb
        s.phases.update(tfdeploy_phases(done.lines))
        per_task: dict[str, list[tuple[float, str]]] = {}
        for t, line in done.lines:
            m = re.match(r"(\S+@\S+) \| (.*)$", line)
            if m:
                per_task.setdefault(m.group(1), []).append((t, m.group(2)))
        s.phases.update(task_marks(list(per_task.values()), len(hosts)))
        s.busy_first = trace.at(s.phases.get("first"))
        s.reinstalled = any(re.search(INSTALLING, line) for _, line in done.lines)
        used = {
            m
            for _, line in done.lines
            if re.search(INSTALLING, line)
            for m in re.findall(r"\((uv|pip), ", line)
        }
        s.installer = "/".join(sorted(used))
        self.last_output = done.lines
        return s


# tfdeploy's plain step lines that end each phase: (pattern, the last match or the first).
PHASE_LINES = {
    "preflight": (r"^tfdeploy: preflight ok", False),
    "resolve": (r"^tfdeploy: environment [0-9a-f]{12} for ", True),  # one line per platform
    "send": (r"^tfdeploy: pushed ", False),
    "install": (r"^tfdeploy: environment (built|reused) on ", True),
}
INSTALLING = r"^tfdeploy: environment built on "


def tfdeploy_phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    found = {}
    for phase, (pattern, last) in PHASE_LINES.items():
        seen = [t for t, line in lines if re.search(pattern, line)]
        if seen:
            found[phase] = seen[-1] if last else seen[0]
    return found


def task_marks(per_task: list[list[tuple[float, str]]], n: int) -> dict[str, float]:
    """ "running": every task printed its first line; "first": every task its first step."""
    marks: dict[str, float] = {}
    for key, text in (("running", RUNNING), ("first", FIRST_STEP)):
        found = [next((t for t, line in lines if text in line), None) for lines in per_task]
        seen = [t for t in found if t is not None]
        if len(seen) == n:
            marks[key] = max(seen)
    if "first" not in marks:
        tail = "\n".join(line for lines in per_task for _, line in lines[-5:])[-1500:]
        raise BenchError(f"not every task printed {FIRST_STEP!r}:\n{tail}")
    return marks
