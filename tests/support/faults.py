"""The fault matrix's tools, shared with the other lab tests that break runs: `tfdeploy up` in the
background with its output read as it comes (`Up`), every task's end as its host recorded it
(`final_states`), and a lab host's processes by command line (`pids_of`).

`Up` records itself in `_STARTED`; tests/integration/test_faults.py interrupts what is still
running after each of its tests.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from remote.protocol import STATE_EXITED, STATE_LOST
from tests.lab import Lab, LabHost

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "digits"
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def _env(state: Path) -> dict[str, str]:
    # PYTHONFAULTHANDLER: an `up` that hangs is killed with SIGABRT, which prints where each
    # of its threads was (finish()).
    return os.environ | {
        "TFDEPLOY_STATE_DIR": str(state),
        "COLUMNS": "200",
        "PYTHONFAULTHANDLER": "1",
    }


def tfdeploy(
    *args: str, state: Path, timeout: float = 120, check_rc: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the CLI the way a user does, with its own local state directory."""
    result = subprocess.run(
        [sys.executable, "-m", "deployer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(state),
    )
    if check_rc is not None:
        assert result.returncode == check_rc, (
            f"exit {result.returncode}, expected {check_rc}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result


_STARTED: list[Up] = []


class Up:
    """`tfdeploy up` (or another verb that watches, `attach`) running in the background; its
    output is read as it comes, with times."""

    def __init__(self, target: Path | str, *flags: str, state: Path, verb: str = "up") -> None:
        _STARTED.append(self)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deployer", verb, *flags, str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(state),
        )
        self.lines: list[tuple[float, str]] = []
        self.stderr = ""
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    @property
    def stdout(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait_for(self, pattern: str, timeout: float = 60, count: int = 1) -> float:
        """Time at which the count-th output line matching pattern arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                hits = [t for t, line in self.lines if re.search(pattern, line)]
                if len(hits) >= count:
                    return hits[count - 1]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._readers[0].is_alive()):
                    raise AssertionError(
                        f"no output line matching {pattern!r} (x{count}); exit {self.proc.poll()}"
                        f"\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
                    )
                self._changed.wait(min(left, 0.5))

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # what it said, and where its threads were: the clue
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            for reader in self._readers:
                reader.join(timeout=5)
            raise AssertionError(f"up did not end within {timeout:g} s\n{self.report()}") from None
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def run_id(self) -> str:
        self.wait_for(r"\(run \S+\)$")
        for _, line in self.lines:
            found = re.search(r"\(run (\S+)\)$", line)
            if found:
                return found.group(1)
        raise AssertionError("no run id printed")

    def report(self) -> str:
        return f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def final_states(
    inventory: Path, run_id: str, tmp_path: Path, *, hosts: int | None = None
) -> dict[str, dict[str, Any]]:
    """Every task of the run as its host recorded it, read from a fresh shell (no local state).

    Fails unless every task has ended (exited, or lost with a record of it).
    """
    status = tfdeploy(
        "status", run_id, "-i", str(inventory), "--json", state=tmp_path / "fresh", check_rc=0
    )
    runs = json.loads(status.stdout)["runs"]
    tasks = {f"{t['name']}@{r['host']}": t for r in runs for t in r["tasks"]}
    assert tasks, f"no host knows run {run_id}"
    if hosts is not None:
        assert len({r["host"] for r in runs}) == hosts, runs
    unfinished = {
        k: t["state"] for k, t in tasks.items() if t["state"] not in (STATE_EXITED, STATE_LOST)
    }
    assert not unfinished, f"tasks of {run_id} not recorded as ended: {unfinished}"
    return tasks


def pids_of(lab: Lab, host: LabHost, needle: str) -> list[int]:
    """Processes whose command line holds needle, not counting the `sh -c` that started them."""
    return [
        p.pid
        for p in lab.processes(host)
        if needle in p.cmdline and not p.cmdline.startswith("/bin/sh")
    ]
