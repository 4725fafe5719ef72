"""AWS GPU fleets on the host side: spot interruption notices stop a task in time, and an idle
watchdog runs a command (a shutdown) once nothing has run for a while.

Real processes, the agent driven over stdin as the control side drives it (test_agent.py). The
metadata service is tests/fakes/imds.py on loopback: nothing here talks to 169.254.169.254.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remote import spot
from tests.fakes.imds import ACTION_PATH, TOKEN_PATH, Imds
from tests.support.agent import (
    AGENT,
    PYTHON,
    alive,
    call,
    host_dir,
    new_run,
    ok,
    start,
    status,
    wait_for,
    wait_state,
)

pytestmark = pytest.mark.timeout(60)

REMOTE = AGENT.parent
# Traps SIGTERM like a trainer that checkpoints: notes the moment, then leaves in good order.
POLITE = """\
import pathlib, signal, sys, time
def bye(signum, frame):
    pathlib.Path("term.marker").write_text(repr(time.time()))
    time.sleep(0.3)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
time.sleep(60)
"""
STUBBORN = 'trap "" TERM; sleep 60'  # the shell and its sleep both ignore SIGTERM
NOTICE_LINE = re.compile(
    r"tfdeploy: spot interruption notice \((\w+) at (\S+)\): SIGTERM now, SIGKILL in (\d+) s"
)


def spot_task(command: str, url: str, interval: float = 0.3, margin: float = 15) -> Any:
    spot_item = {"url": url, "interval": interval, "margin": margin}
    return {"name": "worker:0", "command": command, "spot": spot_item}


def polite_command(tmp_path: Path) -> str:
    script = tmp_path / "polite.py"
    script.write_text(POLITE)
    return f"{PYTHON} {script}"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def task_file(workdir: Path, name: str, index: int = 0) -> Path:
    return host_dir(workdir) / f"runs/r1/tasks/worker-{index}" / name


def notice_line(workdir: Path) -> re.Match[str] | None:
    return NOTICE_LINE.search(task_file(workdir, "output.log").read_text())


# ---- spot interruption notices ----------------------------------------------------------------


def test_a_notice_stops_the_task_at_once_and_is_recorded(workdir: Path, tmp_path: Path) -> None:
    with Imds() as imds:
        run_dir = new_run(workdir)
        start(workdir, spot_task(polite_command(tmp_path), imds.url))
        wait_for(lambda: imds.count("GET", ACTION_PATH) >= 3)
        # IMDSv2: a token first, then GETs that carry it (none was refused).
        assert imds.requests[:2] == [("PUT", TOKEN_PATH), ("GET", ACTION_PATH)]
        assert {code for method, _, code in imds.answers if method == "GET"} == {404}
        imds.revoke_tokens()  # the token lapses: a 401, then a fresh token
        wait_for(lambda: imds.count("PUT", TOKEN_PATH) >= 2)
        assert status(workdir, "worker:0")["state"] == "running"

        at = imds.notice(seconds_from_now=20)
        noticed = time.time()
        marker = run_dir / "code/term.marker"
        wait_for(marker.exists, timeout=3)
        assert float(marker.read_text()) - noticed < 0.3 + 0.25 + 0.5  # interval + tick + slack
        done = wait_state(workdir, "worker:0", "exited")
    assert (done["state"], done["reason"], done["exit_code"]) == ("exited", "preempted", 0)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    assert done["notice"] == {"action": "terminate", "time": when}
    record = json.loads(task_file(workdir, "exit.json").read_text())
    assert record["reason"] == "preempted" and record["notice"] == done["notice"]
    found = notice_line(workdir)
    assert found is not None and found.group(1, 2) == ("terminate", when)
    assert abs(int(found.group(3)) - (at - 15 - noticed)) <= 1.5
    # One notice is all there is: polling ended with it.
    assert [a for a in imds.answers if a[2] == 200 and a[0] == "GET"] == [("GET", ACTION_PATH, 200)]
    assert imds.requests[-1] == ("GET", ACTION_PATH)


def test_a_task_ignoring_sigterm_is_killed_margin_seconds_before_the_end(workdir: Path) -> None:
    with Imds() as imds:
        new_run(workdir)
        start(workdir, spot_task(STUBBORN, imds.url))
        wait_for(lambda: imds.count("GET", ACTION_PATH) >= 1)
        at = imds.notice(seconds_from_now=17)  # SIGKILL 2 s from now (whole seconds: 1-2 s)
        wait_for(lambda: notice_line(workdir), timeout=3)
        assert status(workdir, "worker:0")["state"] == "running"  # SIGTERM changed nothing
        done = wait_state(workdir, "worker:0", "exited", timeout=10)
    assert (done["reason"], done["signal"], done["exit_code"]) == ("preempted", 9, None)
    # SIGKILL at the notice's time minus the margin (a tick of 0.25 s late at most).
    assert at - 15 - 0.1 <= done["ended"] <= at - 15 + 1.0, done["ended"] - (at - 15)


def test_a_notice_inside_the_margin_kills_at_once(workdir: Path) -> None:
    with Imds() as imds:
        imds.notice(action="stop", seconds_from_now=10)  # 10 s left, a margin of 15
        new_run(workdir)
        began = time.time()
        start(workdir, spot_task(STUBBORN, imds.url))
        done = wait_state(workdir, "worker:0", "exited")
    assert (done["reason"], done["signal"]) == ("preempted", 9)
    assert done["ended"] - began < 1.5 and done["notice"]["action"] == "stop"
    found = notice_line(workdir)
    assert found is not None and found.group(3) == "0"


def test_a_stop_after_the_notice_keeps_the_reason_preempted(workdir: Path) -> None:
    with Imds() as imds:
        new_run(workdir)
        start(workdir, spot_task(STUBBORN, imds.url))
        imds.notice(seconds_from_now=60)  # SIGKILL would be 45 s away
        wait_for(lambda: notice_line(workdir), timeout=3)
        began = time.monotonic()
        [done] = ok(call(workdir, "stop", run_id="r1", tasks=["worker:0"], grace=0.5))["tasks"]
    assert time.monotonic() - began < 2.0
    assert (done["state"], done["reason"], done["signal"]) == ("exited", "preempted", 9)


class _Garbage(Imds):
    """Answers everything with 200 and HTML, tokens included (a captive portal, say)."""

    def _answer(self, method: str, path: str, headers: Any) -> tuple[int, bytes]:
        return 200, b"<html>hello</html>"


@contextlib.contextmanager
def broken_imds(kind: str) -> Iterator[str]:
    """The URL of a metadata service that is down, talks garbage or never answers."""
    if kind == "down":
        yield f"http://127.0.0.1:{closed_port()}"
    elif kind == "garbage":
        with _Garbage() as imds:
            yield imds.url
    else:  # accepts connections (the kernel's backlog) and never answers: every read times out
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_broken_metadata_service_never_disturbs_the_task(workdir: Path) -> None:
    kinds = ["down", "garbage", "hanging"]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(broken_imds(kind)) for kind in kinds]
        new_run(workdir)
        tasks = [
            {**spot_task("sleep 30", url, interval=0.2), "name": f"worker:{n}"}
            for n, url in enumerate(urls)
        ]
        start(workdir, *tasks)
        time.sleep(1.0)  # five polls of each
        for n, kind in enumerate(kinds):
            assert status(workdir, f"worker:{n}")["state"] == "running", kind
            for log in ("output.log", "supervisor.log"):
                assert task_file(workdir, log, n).read_bytes() == b"", (kind, log)
        # The supervisors' stop ticks never wait for the network.
        began = time.monotonic()
        names = [t["name"] for t in tasks]
        done = ok(call(workdir, "stop", run_id="r1", tasks=names, grace=5))["tasks"]
        assert time.monotonic() - began < 1.5
    assert [(d["reason"], d["signal"], d["notice"]) for d in done] == [("stopped", 15, None)] * 3


def test_the_spot_item_is_stored_with_its_defaults(workdir: Path) -> None:
    new_run(workdir)
    url = f"http://127.0.0.1:{closed_port()}"
    start(workdir, {"name": "worker:0", "command": "sleep 30", "spot": {"url": url}})
    spec = json.loads(task_file(workdir, "spec.json").read_text())
    assert spec["spot"] == {"url": url, "interval": 5.0, "margin": 15.0}
    # Without a url: the real metadata service (checked without starting anything).
    code = "import taskops; print(taskops.spot_spec({}, 'w'))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REMOTE, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str({"url": spot.DEFAULT_URL, "interval": 5.0, "margin": 15.0})


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("yes", "parameter 'spot' must be an object"),
        ({"interval": "5"}, "task worker:0: spot: parameter 'interval' must be"),
        ({"interval": 0}, "spot interval must be more than 0 s"),
        ({"margin": -1}, "spot margin must be 0 s or more"),
        ({"margin": True}, "parameter 'margin' must be an integer or a number, got a boolean"),
        ({"url": "https://169.254.169.254"}, "is not usable: it must be http://HOST"),
        ({"url": "http://host:99999"}, "is not usable"),
        ({"url": "http://host/latest"}, "is not usable"),
        ({"urls": "http://x"}, "spot has unknown keys ['urls']"),
    ],
)
def test_a_bad_spot_item_is_refused(workdir: Path, item: Any, needle: str) -> None:
    new_run(workdir)
    task = {"name": "worker:0", "command": "sleep 30", "spot": item}
    reply = call(workdir, "start", run_id="r1", tasks=[task], grace=1)
    assert reply["ok"] is False and needle in reply["error"], reply
    assert not task_file(workdir, "spec.json").exists()


END = 1795445400.0  # 2026-11-23T14:50:00Z


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"action": "terminate", "time": "2026-11-23T14:50:00Z"}', ("terminate", END)),
        (b'{"action": "hibernate", "time": "2026-11-23T14:50:00+00:00"}', ("hibernate", END)),
        (b'{"action": "stop", "time": "soon"}', ("stop", 1000.0 + 120)),  # AWS's two minutes
        (b'{"action": "reboot", "time": "2026-11-23T14:50:00Z"}', None),
        (b'{"action": "terminate"', None),
        (b"<html>", None),
        (b"[]", None),
        (b"", None),
    ],
)
def test_notice_bodies(body: bytes, expected: tuple[str, float] | None) -> None:
    found = spot.parse_notice(body, now=1000.0)
    assert (found and (found.action, found.at)) == expected


# ---- the idle watchdog ------------------------------------------------------------------------


def watchdogs(workdir: Path) -> list[int]:
    """Live idle watchdogs of this workdir, found by their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = b"idle-watch" in argv and any(str(workdir).encode() in a for a in argv)
        if mine and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def idle_wd(workdir: Path) -> Iterator[Path]:
    """The workdir; after the test no watchdog of it may be left (any left is killed)."""
    yield workdir
    left = watchdogs(workdir)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"idle watchdogs left running: {left}"


def arm(workdir: Path, **params: Any) -> dict[str, Any]:
    return ok(call(workdir, "idle", **params))


def test_idle_fires_when_nothing_runs(idle_wd: Path, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    began = time.monotonic()
    reply = arm(idle_wd, minutes=0.015, interval=0.2, command=f"echo fired > {marker}")
    assert (reply["armed"], reply["minutes"]) == (True, 0.015) and alive(reply["pid"])
    wait_for(marker.exists, timeout=8)
    assert time.monotonic() - began >= 0.9 - 0.2
    wait_for(lambda: not alive(reply["pid"]), timeout=3)
    host = host_dir(idle_wd)
    fired = json.loads((host / "idle-fired.json").read_text())
    assert (fired["command"], fired["code"]) == (f"echo fired > {marker}", 0)
    log = (host / "idle.log").read_text()
    assert "no active run: running echo fired" in log and "ended with status 0" in log
    assert not (host / "idle.pid").exists()


def test_idle_waits_while_a_task_runs(idle_wd: Path, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    new_run(idle_wd)
    start(idle_wd, {"name": "worker:0", "command": "sleep 2"})
    arm(idle_wd, minutes=0.015, interval=0.2, command=f"touch {marker}")
    exited = wait_state(idle_wd, "worker:0", "exited", timeout=8)
    assert not marker.exists()  # 0.9 s of allowance went by while the task ran
    wait_for(marker.exists, timeout=6)
    # The clock started when the task ended, not when it was armed (that would fire about 0.9 s
    # after `started`): the task's process lived its 2 s, so the command fires about 2.9 s after
    # the `started` its supervisor recorded (just after the exec; 0.5 s for that lag). Times the
    # host recorded, never when this test happened to look (under load a look comes late), nor
    # the recorded `ended` (written after the death the watchdog may see first).
    assert marker.stat().st_mtime - exited["started"] >= 2 + 0.9 - 0.5
    wait_for(lambda: not watchdogs(idle_wd), timeout=3)


def test_rearming_keeps_one_watchdog_and_zero_minutes_disarms(idle_wd: Path) -> None:
    first = arm(idle_wd, minutes=5, interval=0.2, command="true")
    host = host_dir(idle_wd)
    armed_at = json.loads((host / "idle.json").read_text())["armed_at"]
    second = arm(idle_wd, minutes=10, interval=0.2, command="true")
    pid = first["pid"]
    assert second["pid"] == pid and watchdogs(idle_wd) == [pid]
    settings = json.loads((host / "idle.json").read_text())
    assert settings["minutes"] == 10 and settings["armed_at"] > armed_at
    # Detached: the session (and process group) of the first fork, which is gone; not our child.
    stat = Path(f"/proc/{pid}/stat").read_text()
    ppid, pgrp, session = (int(f) for f in stat[stat.rfind(")") + 2 :].split()[1:4])
    assert pgrp == session != os.getsid(0) and not alive(session) and ppid != os.getpid()
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    off = arm(idle_wd, minutes=0)
    assert (off["armed"], off["pid"], off["minutes"]) == (False, None, 0.0)
    wait_for(lambda: not alive(pid), timeout=3)
    assert not (host / "idle.json").exists() and not (host / "idle.pid").exists()
    assert not (host / "idle-fired.json").exists()


def test_the_watchdog_leaves_with_its_workdir(idle_wd: Path) -> None:
    pid = arm(idle_wd, minutes=5, interval=0.2, command="true")["pid"]
    shutil.rmtree(idle_wd)
    wait_for(lambda: not alive(pid), timeout=3)


def test_disarming_where_nothing_was_armed_creates_nothing(tmp_path: Path) -> None:
    reply = arm(tmp_path / "wd", minutes=0)
    assert reply["armed"] is False and not (tmp_path / "wd").exists()


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({}, "needs the parameter 'minutes'"),
        ({"minutes": -1}, "minutes must be 0 (disarm) or more"),
        ({"minutes": "5"}, "parameter 'minutes' must be"),
        ({"minutes": True}, "got a boolean"),
        ({"minutes": math.inf}, "minutes must be a finite number"),
        ({"minutes": 5, "interval": 0}, "interval must be more than 0"),
        ({"minutes": 5, "command": "  "}, "non-empty shell command"),
    ],
)
def test_bad_idle_requests_are_refused(tmp_path: Path, params: Any, needle: str) -> None:
    reply = call(tmp_path / "wd", "idle", **params)
    assert reply["ok"] is False and needle in reply["error"], reply
    assert not (tmp_path / "wd").exists()


def test_the_default_command_powers_off() -> None:
    """Only read, never run: the agent's modules in a child, as they import on a host."""
    code = "import idle; print(idle.default_command())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REMOTE, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ("shutdown -h now" if os.geteuid() == 0 else "sudo -n shutdown -h now")
