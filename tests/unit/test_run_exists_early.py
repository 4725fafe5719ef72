"""Issue 47: a run exists from its first byte on a host, for `down`, `status` and `prune`.

`down INVENTORY` while `up` pushed said `nothing to stop`, exit 0, and the job then started:
before its code arrived a run was only a port reservation, which no `runs` reply listed and a
stop released without a trace. Now the reservation names its job and is listed as a starting
run; a stop of it leaves a stop marker, and the host refuses the rest of the run: its
reservation, its code, its setup and its start. The real agent, driven as the control side
drives it (test_agent.py); the same over SSH with a real `up` and `down`:
tests/integration/test_run_exists_early.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.agent import call, new_run, ok

pytestmark = pytest.mark.timeout(60)

STOPPED = "was stopped on this host (`tfdeploy down`, or its own `up`'s teardown) before it"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def runs(workdir: Path) -> dict[str, dict[str, object]]:
    return {r["run_id"]: r for r in ok(call(workdir, "runs"))["runs"]}


def test_a_run_being_pushed_is_listed_stopped_and_then_refused(workdir: Path) -> None:
    port = free_port()
    ok(call(workdir, "hello", ports=[port], run_id="demo-1", lease_seconds=30, job="demo"))
    listed = runs(workdir)["demo-1"]  # its preflight reserved the ports; no folder yet
    assert (listed["job"], listed["starting"], listed["tasks"]) == ("demo", True, [])
    pruned = ok(call(workdir, "prune", keep=0, grace=0))
    assert pruned["running"] == ["demo-1"] and pruned["runs"] == []  # prune sees it too
    ok(call(workdir, "stop", run_id="demo-1", tasks=None, grace=0))  # `down` during the push
    assert "demo-1" not in runs(workdir)  # stopped before it ran: nothing to list
    assert list(workdir.glob("hosts/*/ports/*.json")) == []  # its reservation went
    # The rest of its `up` arrives: every step of it is refused, saying why.
    pushed = call(workdir, "materialize", run_id="demo-1", job="demo", files=[], detached=False)
    assert not pushed["ok"] and STOPPED in pushed["error"], pushed
    again = call(workdir, "hello", ports=[port], run_id="demo-1", lease_seconds=30, job="demo")
    assert not again["ok"] and STOPPED in again["error"], again
    started = call(
        workdir, "start", run_id="demo-1", tasks=[{"name": "worker:0", "command": "true"}], grace=1
    )
    assert not started["ok"] and STOPPED in started["error"], started
    assert not list(workdir.glob("hosts/*/runs/demo-1/tasks/*"))


def test_a_run_whose_code_arrived_but_no_task_yet_is_starting_until_stopped(
    workdir: Path,
) -> None:
    new_run(workdir, "demo-2", lease_seconds=30)  # pushed: its setup or start is next
    listed = runs(workdir)["demo-2"]
    assert (listed["starting"], listed["tasks"]) == (True, [])
    ok(call(workdir, "stop", run_id="demo-2", tasks=None, grace=0))
    assert runs(workdir)["demo-2"]["starting"] is False  # stopped: listed, no longer starting
    setup = call(
        workdir, "setup", run_id="demo-2", commands=["touch ran"], fingerprint="f" * 16, env={}
    )
    assert not setup["ok"] and STOPPED in setup["error"], setup
    started = call(
        workdir, "start", run_id="demo-2", tasks=[{"name": "worker:0", "command": "true"}], grace=1
    )
    assert not started["ok"] and STOPPED in started["error"], started
