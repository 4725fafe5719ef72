"""`up --resume RUN` (issue 59): the controller's judgment of a run its hosts reported
(deployer/up/resume.py), and the agent's resuming hello and start (remote/resume.py)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from deployer import api
from deployer.config.inventory import load_inventory
from deployer.config.plan import Plan, make_plan
from deployer.hosts.reply_types import TaskStatus
from deployer.results.runs import HostRun
from deployer.up import resume
from tests.support.agent import call, new_run, ok, runs_dir, start, wait_state

RUN = "j-20261207T150000Z-ab12"
HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "worker" }]

[[hosts]]
address = "10.0.0.2"
tasks = [{ role = "worker" }]
"""


def _plan(tmp_path: Path, hosts: str = HOSTS) -> Plan:
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(f'[job]\nname = "j"\ncode = "code"\ncommand = "python3 t.py"\n{hosts}')
    return make_plan(load_inventory(inventory))


def _ended(name: str, code: int | None, reason: str, log_bytes: int = 10) -> TaskStatus:
    signal = None if code is not None else 15
    return TaskStatus(
        name, "exited", exit_code=code, signal=signal, reason=reason, log_bytes=log_bytes
    )


def _runs(*tasks: TaskStatus, job: str = "j", **fields: bool) -> list[HostRun]:
    hosts = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    return [
        HostRun(h, RUN, job, 100.0 + i, True, (t,), **fields)
        for i, (h, t) in enumerate(zip(hosts, tasks, strict=False))
    ]


STOPPED = (_ended("worker:0", None, "stopped", 7), _ended("worker:1", None, "stopped", 9))


def test_a_run_stopped_by_down_is_resumable_from_its_first_start_and_its_logs_ends(
    tmp_path: Path,
) -> None:
    found = resume.judge(_runs(*STOPPED), _plan(tmp_path), RUN)
    assert (found.began, dict(found.log_bytes)) == (100.0, {"worker:0": 7, "worker:1": 9})
    # a worker that exited 0 on down's SIGTERM has not succeeded: still resumable
    by_sigterm = (_ended("worker:0", 0, "stopped"), _ended("worker:1", 0, "stopped"))
    assert resume.judge(_runs(*by_sigterm), _plan(tmp_path), RUN).run_id == RUN


@pytest.mark.parametrize(
    ("runs", "said"),
    [
        (
            _runs(*STOPPED, job="other"),
            "it is a run of job 'other', and this inventory's job is 'j'",
        ),
        (
            _runs(STOPPED[0], TaskStatus("worker:1", "running")),
            "it is still running",
        ),
        (_runs(*STOPPED, kept=True), "it is still kept by its keeper"),
        (_runs(*STOPPED, leased=True), "it is still running"),
        (
            _runs(*STOPPED, _ended("worker:2", None, "stopped")),
            "no longer matches its tasks: worker:2 of the run is not in the plan",
        ),
        (_runs(STOPPED[0]), "the inventory's plan no longer matches its tasks: worker:1 is not in"),
        (
            _runs(_ended("worker:0", 0, "exited"), _ended("worker:1", 0, "exited")),
            "it succeeded, there is nothing to resume",
        ),
    ],
)
def test_a_run_that_cannot_be_resumed_is_refused_with_its_reason(
    tmp_path: Path, runs: list[HostRun], said: str
) -> None:
    with pytest.raises(resume.ResumeRefused) as refused:
        resume.judge(runs, _plan(tmp_path), RUN)
    message = refused.value.message
    assert message.startswith(f"cannot resume run {RUN}: ") and said in message, message
    assert refused.value.exit_status == 2


def test_a_task_on_another_host_than_the_plan_says_is_named(tmp_path: Path) -> None:
    swapped = [
        HostRun("10.0.0.2", RUN, "j", 100.0, True, (STOPPED[0],)),
        HostRun("10.0.0.1", RUN, "j", 100.0, True, (STOPPED[1],)),
    ]
    with pytest.raises(resume.ResumeRefused) as refused:
        resume.judge(swapped, _plan(tmp_path), RUN)
    assert "worker:0 ran on 10.0.0.2, the plan puts it on 10.0.0.1" in refused.value.message
    assert "starts a new run" in (refused.value.hint or "")


def test_the_next_attempt_follows_the_highest_any_host_said() -> None:
    assert resume.next_attempt({"h1": {"attempt": 0}, "h2": {"attempt": 2}}) == 3
    assert resume.next_attempt({"h1": {}}) == 1


def _hello(workdir: Path, job: str = "demo", run_id: str = "r1") -> dict[str, object]:
    return call(workdir, "hello", ports=[], run_id=run_id, job=job, resume=True)


def test_a_resuming_hello_lifts_the_stop_and_says_the_last_attempt(workdir: Path) -> None:
    new_run(workdir)
    task = {"name": "worker:0", "command": "true", "env": {"TFDEPLOY_ATTEMPT": "2"}}
    start(workdir, task)
    wait_state(workdir, "worker:0", "exited")
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))
    refused = call(workdir, "start", run_id="r1", tasks=[task])
    assert refused["ok"] is False and "was stopped" in refused["error"]

    assert ok(_hello(workdir))["attempt"] == 2
    assert not (runs_dir(workdir) / "r1" / "stop").exists()
    again = {**task, "env": {"TFDEPLOY_ATTEMPT": "3"}}
    ok(call(workdir, "start", run_id="r1", tasks=[again], grace=1, resumed=True))
    wait_state(workdir, "worker:0", "exited")
    log = (runs_dir(workdir) / "r1/tasks/worker-0/output.log").read_text()
    assert "tfdeploy: run r1 resumed by `tfdeploy up --resume` (attempt 3)\n" in log


def test_a_resuming_hello_refuses_what_cannot_be_resumed_and_changes_nothing(
    workdir: Path,
) -> None:
    refused = _hello(workdir, run_id="absent")
    assert refused["ok"] is False and refused["code"] == "no run"
    new_run(workdir)
    refused = _hello(workdir, job="other")
    assert refused["ok"] is False and "run r1 is of job 'demo', not 'other'" in refused["error"]
    start(workdir, {"name": "worker:0", "command": "sleep 30"})
    refused = _hello(workdir)
    assert refused["ok"] is False and "task worker-0 of run r1 is still running" in refused["error"]


@pytest.mark.parametrize("value", ["../r1", f"{RUN}\n"])
def test_up_refuses_a_resume_that_names_no_run_id_before_anything(
    tmp_path: Path, value: str
) -> None:
    _plan(tmp_path)
    with pytest.raises(api.UsageError, match=r"is not a run id to resume") as refused:
        api.up(tmp_path / "inv.toml", resume=value)
    assert refused.value.message.startswith(repr(value))


def test_a_prune_between_a_resuming_hello_and_its_push_spares_the_run(workdir: Path) -> None:
    """The resuming hello reserved the run's ports and lifted its stop; its push (which writes
    a live lease) comes later. A prune meanwhile must not take the run's folder, and with it the
    checkpoint the resume is for: a live reservation of the run spares it, as a lease does."""
    run_dir = new_run(workdir)
    (run_dir / "code" / "ckpt").write_text("step 7")
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))
    long_ago = time.time() - 3600  # the run ended an hour ago: its lease lapsed then
    os.utime(run_dir / "lease", (long_ago, long_ago))
    port = _free_port()
    ok(call(workdir, "hello", ports=[port], run_id="r1", job="demo", lease_seconds=60, resume=True))

    reply = ok(call(workdir, "prune", keep=0, grace=0))

    assert reply["runs"] == [] and reply["running"] == ["r1"]
    assert (run_dir / "code" / "ckpt").read_text() == "step 7"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reserved_not_lifted(workdir: Path, port: int) -> None:
    """A resuming hello half-way, as another hello on this host may find it: run r1's ports
    reserved, its stop not lifted yet (reservations.reserve, in a process of its own)."""
    import subprocess
    import sys

    from tests.support.agent import AGENT

    script = (
        f"import sys; sys.path.insert(0, {str(AGENT.parent)!r})\n"
        "from pathlib import Path\nimport reservations\n"
        f"print(reservations.reserve(Path({str(workdir)!r}), 'r1', [{port}], 60, "
        "lambda p: True, 'demo', resuming=True))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "([], {})", done.stderr


def test_a_resuming_hello_holds_its_ports_before_it_lifts_the_stop(workdir: Path) -> None:
    """Between its reservation and the lift of the run's stop, another run's hello must not
    take the ports (a stopped run's reservations are free to take), nor a second `up --resume`
    of the run pass: the check and the reservation are one step under the ports' lock."""
    new_run(workdir)
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))
    port = _free_port()
    _reserved_not_lifted(workdir, port)

    other = ok(call(workdir, "hello", ports=[port], run_id="r2", job="demo", lease_seconds=60))
    assert other["busy_ports"] == [port] and other["reserved_by"] == {str(port): "r1"}
    again = call(workdir, "hello", ports=[port], run_id="r1", job="demo", resume=True)
    assert again["ok"] is False and "an `up` of run r1 is starting here already" in again["error"]
    assert (runs_dir(workdir) / "r1" / "stop").exists()  # the refused one lifted nothing


@pytest.mark.parametrize("recorded", ["\u00b2", "1" * 40, "-1"])
def test_a_damaged_attempt_in_a_tasks_record_counts_as_none(workdir: Path, recorded: str) -> None:
    """spec.json is this host's own file, but a person or a full disk may have changed it."""
    import json

    new_run(workdir)
    task = {"name": "worker:0", "command": "true", "env": {"TFDEPLOY_ATTEMPT": "0"}}
    start(workdir, task)
    wait_state(workdir, "worker:0", "exited")
    spec_path = runs_dir(workdir) / "r1" / "tasks" / "worker-0" / "spec.json"
    spec = json.loads(spec_path.read_text())
    spec["env"]["TFDEPLOY_ATTEMPT"] = recorded
    spec_path.write_text(json.dumps(spec))
    assert ok(_hello(workdir))["attempt"] == 0


def test_a_run_being_resumed_is_starting_until_its_tasks_start_so_down_of_the_job_finds_it(
    workdir: Path,
) -> None:
    """From the resuming hello to the first start (push, environment, setup: minutes), the
    run's earlier tasks have all ended: it must still read `starting`, which makes it active
    for `down INVENTORY` and `status` (before, it read ended and `down` of the job skipped
    it, and the resume then started its tasks)."""
    run_dir = new_run(workdir)
    [task] = start(workdir, {"name": "worker:0", "command": "true"})
    wait_state(workdir, "worker:0", "exited")
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))

    def listed() -> dict[str, object]:
        [run] = [r for r in ok(call(workdir, "runs"))["runs"] if r["run_id"] == "r1"]
        return run

    assert listed()["starting"] is False  # ended: nothing prepares it
    port = _free_port()
    ok(call(workdir, "hello", ports=[port], run_id="r1", job="demo", lease_seconds=60, resume=True))
    assert listed()["starting"] is True
    from deployer.results.runs import _host_run, _HostLists

    assert _host_run("h1", listed(), _HostLists()).active
    start(workdir, {"name": "worker:0", "command": "sleep 30"})
    assert listed()["starting"] is False  # its tasks took the reservation over
    ok(call(workdir, "stop", run_id="r1", tasks=None, grace=0))
    assert (run_dir / "tasks").is_dir() and task["pid"]
