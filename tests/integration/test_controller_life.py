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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab, LabHost
from tests.support.faults import pids_of
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # firewall rules need each host's netns

# A task: says it is up, prints `lines` lines of 40 bytes, then sleeps `sleep` seconds.
TASK = """
import sys, time
lines, sleep = int(sys.argv[1]), float(sys.argv[2])
print("up in", flush=True)
for i in range(lines):
    print("n" * 30, i, flush=True)
time.sleep(sleep)
"""


def task_inventory(
    lab: Lab, lab_inventory: Any, tmp_path: Path, roles: list[str], args: str, **job: Any
) -> Path:
    """One task per host with `roles`, each running TASK with `args` (`LINES SLEEP`)."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "life.py").write_text(TASK)
    command = f"{lab.python} life.py {args}"
    table = {"name": "life", "command": command, "stop_grace": 2, "lease_seconds": 5} | job
    table.setdefault("role_commands", {"ps": command})
    layout = [[{"role": role}] for role in roles]
    return lab_inventory(layout, code=code, job=table)  # type: ignore[no-any-return]


def tfdeploy_rules(lab: Lab, host: LabHost) -> str:
    """The host's nft and iptables rules of tfdeploy (as tests/integration/test_firewall.py)."""
    nft = lab.run(host, ["nft", "list", "ruleset"]).stdout
    ipt = lab.run(host, ["iptables", "-S"]).stdout + lab.run(host, ["ip6tables", "-S"]).stdout
    return "\n".join(line for line in (nft + ipt).splitlines() if "tfdeploy" in line)


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> float:
    """Seconds it took for check() to become true; fails after timeout."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - began


def no_task_left(lab: Lab, hosts: list[LabHost]) -> Callable[[], bool]:
    return lambda: not any(pids_of(lab, h, "life.py") for h in hosts)


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
        lab, lab_inventory, tmp_path, ["worker"] * 2, "0 3600", firewall=True, lease_seconds=60
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
        wait_until("both tasks to run", lambda: all(pids_of(lab, h, "life.py") for h in hosts), 30)
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


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small filesystem of its own at `where` (root only), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("disk", ["full-state-dir", "read-only-state-dir", "full-stdout"])
def test_a_full_or_read_only_controller_disk_leaves_the_job_to_its_own_end(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, disk: str
) -> None:
    """Issue 39 item 9: the local log archive's ENOSPC escaped the watch loop (`internal error:
    OSError`), stopped a healthy job and, with `firewall = true`, left its rules on the hosts."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs: needs root")
    lab = clean_lab
    hosts = lab.hosts[:2]
    # 3,000 lines of 40 bytes per task: the archive needs far more than the 64 KiB it gets.
    inventory = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        ["worker"] * 2,
        "3000 0",
        firewall=True,
        lease_seconds=60,
    )
    state = tmp_path / "state"
    size = "64k" if disk != "full-stdout" else "64m"  # full-stdout: the state dir has room
    with _tmpfs(state, size):
        if disk == "read-only-state-dir":
            subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        stdout = "/dev/full" if disk == "full-stdout" else str(tmp_path / "out.txt")
        env = os.environ | {"TFDEPLOY_STATE_DIR": str(state), "COLUMNS": "200"}
        with open(stdout, "w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "deployer", "up", str(inventory)],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                timeout=180,
            )
        said = done.stderr if disk == "full-stdout" else (tmp_path / "out.txt").read_text()
        assert done.returncode == 0, f"{said}\n{done.stderr}"
        assert "internal error" not in said + done.stderr
        warnings = [line for line in said.splitlines() if "warning: cannot" in line]
        assert len(warnings) == 1 + (disk == "read-only-state-dir"), said
        where = "stdout (/dev/full)" if disk == "full-stdout" else str(state)
        assert where in warnings[0], warnings
        if disk != "full-stdout":
            assert "the job goes on" in warnings[0]
            assert "job succeeded" in said, said
    assert not any(tfdeploy_rules(lab, h) for h in hosts), "firewall rules left"
    assert not any(pids_of(lab, h, "life.py") for h in hosts)


def test_up_detach_killed_while_starting_leaves_nothing_running(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Issue 39 item 7: a detached run held no lease from its first start, so `up --detach`
    SIGKILLed while it waited for the ps to listen left `ps:0` running (and its port taken)."""
    lab = clean_lab
    hosts = lab.hosts[:2]
    inventory = task_inventory(
        lab,
        lab_inventory,
        tmp_path,
        ["ps", "worker"],
        "0 3600",  # the ps never listens: `up` waits for it until start_timeout
        start_timeout=120,
    )
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")}
    up = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", "--detach", str(inventory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_until("the ps to start", lambda: pids_of(lab, hosts[0], "life.py"), 60)
        up.kill()  # while it waits for the ps to listen
        up.wait(timeout=10)
        time.sleep(1)
        assert pids_of(lab, hosts[0], "life.py"), "the ps died with `up`: nothing was tested"
        took = wait_until("the lease to stop the ps", no_task_left(lab, hosts), 5 + 1 + 2 + 6)
        print(f"up --detach killed mid-start: every task stopped {took + 1:.1f} s later")
    finally:
        if up.poll() is None:
            up.kill()
        if any(pids_of(lab, h, "life.py") for h in hosts):
            tfdeploy("down", str(inventory), state=tmp_path / "cleanup")
