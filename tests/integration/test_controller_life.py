"""The controller's own life: a terminal that goes away, a killed `up --detach`, a full disk.

Each test ends a real `up` the way the world does (a pty whose master closes, SIGKILL, a disk
with no room left) and then checks every lab host: every task stopped, no process or port left
(`clean_lab`) and, with `firewall = true`, no rule of the run left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_faults import no_task_left, pids_of, task_inventory, wait_until
from tests.integration.test_firewall import tfdeploy_rules
from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # firewall rules need each host's netns


def _read_until(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    """What `proc` wrote until `needle` appeared; fails after `timeout`."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    while needle not in seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"never saw {needle!r}:\n{seen.decode(errors='replace')}")
        chunk = proc.stdout.read(65536)
        seen += chunk or b""
        time.sleep(0.05)
    return seen


def test_a_terminal_that_goes_away_during_up_still_tears_everything_down(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 39 item 6: the pty's master closed (a window closed, an SSH session dropped), the
    SIGHUP handler's first print failed with EIO, and no teardown ran at all."""
    lab = clean_lab
    hosts = lab.hosts[:2]
    inventory = task_inventory(
        lab, lab_inventory, tmp_path, [[{"role": "worker"}]] * 2, firewall=True, lease_seconds=60
    )
    up = [sys.executable, "-m", "deployer", "up", str(inventory)]
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "TERM": "xterm"}
    # `script` gives `up` a real terminal; killing it closes the terminal's master side.
    terminal = subprocess.Popen(
        ["script", "-qfec", shlex.join(up), "/dev/null"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    controller: list[int] = []
    try:
        _read_until(terminal, b"up in", timeout=90)
        wait_until("both tasks to run", lambda: all(pids_of(lab, h, "task.py") for h in hosts), 30)
        assert all(tfdeploy_rules(lab, h) for h in hosts), "the firewall was never set up"
        controller = _descendants(terminal.pid)
        terminal.kill()  # the pty's master closes: `up` gets SIGHUP, and EIO on every write
        terminal.wait(timeout=10)
        # Well within the lease (60 s): the controller's own teardown stopped them.
        took = wait_until("teardown to stop every task", no_task_left(lab, hosts), 20)
        print(f"terminal gone: every task stopped {took:.1f} s later")
        wait_until("the controller to exit", lambda: not any(map(_alive, controller)), 30)
        assert not any(tfdeploy_rules(lab, h) for h in hosts), "firewall rules left"
        [index] = (tmp_path / "state" / "runs").glob("*/archive.json")
        assert json.loads(index.read_text())["ended"], "the log archive was never ended"
    finally:
        _cleanup(terminal, controller, inventory, tmp_path)


def _cleanup(
    terminal: subprocess.Popen[bytes], controller: list[int], inventory: Path, tmp_path: Path
) -> None:
    """A test that failed half-way leaves no controller, task or rule for the next one."""
    if terminal.poll() is None:
        terminal.kill()
    for pid in controller:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    tfdeploy("down", str(inventory), state=tmp_path / "cleanup")


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (the `up` that `script` runs, and its ssh children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            found.append(int(child))
            todo.append(int(child))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
