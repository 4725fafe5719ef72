"""The Python API (deployer.api) on this machine through the real agent (`transport = "local"`):
quiet unless given a view, typed errors, attached and detached runs, and a handle that works
again from the run id alone. The example script's run (TensorFlow) is test_api_example.py."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from deployer import api
from deployer.api.handle import started
from deployer.api.inventories import load
from deployer.config.plan import make_plan
from tests.support import standin
from tests.support.helpers import free_port

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def job(tmp: Path, command: str, **extra: Any) -> dict[str, Any]:
    """One worker on this machine running `command`, as a dict of the inventory's shape."""
    (tmp / "code").mkdir(exist_ok=True)
    spec = {
        "name": "apitest",
        "code": "code",  # relative to `base`
        "command": command,
        "workdir": str(tmp / "wd"),
        "python": sys.executable,
        "port": free_port(),
        "require_tensorflow": False,
        "stop_grace": 1,
    }
    host = {"name": "local", "address": "127.0.0.1", "transport": "local"}
    return {"job": spec | extra, "hosts": [host | {"tasks": [{"role": "worker"}]}]}


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def alive(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_attached_up_prints_nothing_and_returns_the_result(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = api.up(job(tmp_path, "sh -c 'echo trained'"), base=tmp_path)
    assert result.succeeded
    assert [(t.task, t.state, t.exit_code) for t in result.tasks] == [("worker:0", "exited", 0)]
    assert [(line.label, line.text) for line in result.run.logs()] == [
        ("worker:0@local", "trained")
    ]
    assert [t.outcome for t in result.run.status()] == ["exit code 0"]
    assert capfd.readouterr() == ("", "")  # no event, no log line, no note on stdout or stderr


def test_a_plain_view_gets_what_the_cli_prints_to_a_pipe(tmp_path: Path) -> None:
    out = io.StringIO()
    api.up(job(tmp_path, "sh -c 'echo hi'"), base=tmp_path, view=api.PlainView(out))
    lines = out.getvalue().splitlines()
    assert "worker:0@local | hi" in lines
    assert any(line.startswith("tfdeploy: preflight ok") for line in lines), lines


def test_a_detached_run_is_waited_for_and_read_through_its_handle_with_secrets_masked(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "go"  # the task runs until the test has seen it running
    spec = job(
        tmp_path,
        f"sh -c 'while [ ! -e {gate} ]; do sleep 0.05; done; echo token=$API_TOKEN'",
        env={"API_TOKEN": "s3cr3t-v4lue"},
    )
    run = api.up(spec, base=tmp_path, detach=True)
    states = run.status()
    assert [(t.task, t.state) for t in states] == [("worker:0", "running")]
    gate.touch()
    result = run.wait(timeout=60, interval=0.2)
    assert result.succeeded and result.run_id == run.id
    again = api.attach(run.id, inventory=spec, base=tmp_path)  # as a pipeline's next step would
    assert [line.text for line in again.logs()] == ["token=********"]
    assert run.down() == ()  # it ended by itself: nothing to stop
    assert not alive(states[0].pid)


def test_a_failed_task_is_raised_as_job_failed_naming_its_run(tmp_path: Path) -> None:
    spec = job(tmp_path, "sh -c 'echo dying; exit 3'")
    with pytest.raises(api.JobFailed) as caught:
        api.up(spec, base=tmp_path)
    assert "worker:0@local" in caught.value.message and "exit code 3" in caught.value.message
    assert caught.value.run_id is not None and caught.value.run_id.startswith("apitest-")
    run = api.attach(caught.value.run_id, inventory=spec, base=tmp_path)
    assert [line.text for line in run.logs()] == ["dying"]
    assert [t.exit_code for t in run.status()] == [3]


def test_a_detached_failure_is_raised_by_wait(tmp_path: Path) -> None:
    run = api.up(job(tmp_path, "sh -c 'exit 5'"), base=tmp_path, detach=True)
    with pytest.raises(api.JobFailed, match="exit code 5") as caught:
        run.wait(timeout=60, interval=0.2)
    assert caught.value.run_id == run.id
    assert caught.value.hint == "Run.logs(task='worker:0') shows its output"


def test_wait_gives_up_at_its_timeout_and_down_stops_the_run(tmp_path: Path) -> None:
    run = api.up(job(tmp_path, "sleep 60"), base=tmp_path, detach=True)
    (task,) = run.status()
    with pytest.raises(api.JobFailed, match=r"still runs after 0\.5 s"):
        run.wait(timeout=0.5, interval=0.1)
    said: list[str] = []
    assert run.down(say=said.append) == ("local",)
    assert said == [f"stopped run {run.id} on local"]
    assert [t.state for t in run.status()] == ["exited"]
    assert not alive(task.pid)


def test_a_dict_is_checked_like_a_file_naming_the_key_path(tmp_path: Path) -> None:
    spec = job(tmp_path, "true")
    plan = api.plan(spec, base=tmp_path)
    assert [(t.name, t.endpoint) for t in plan.tasks] == [
        ("worker:0", f"127.0.0.1:{spec['job']['port']}")
    ]
    spec["job"]["comand"] = "typo"
    with pytest.raises(api.InventoryError) as caught:
        api.plan(spec, base=tmp_path)
    assert caught.value.path == str(tmp_path / "<inventory dict>")
    assert "job.comand" in caught.value.message


def test_a_file_inventory_takes_no_base_and_an_unknown_run_is_a_usage_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "inv.toml").write_text("")
    with pytest.raises(api.UsageError, match="base is for a dict inventory"):
        api.plan(tmp_path / "inv.toml", base=tmp_path)
    with pytest.raises(api.UsageError, match="neither an inventory file nor a run known"):
        api.attach("apitest-20260101T000000Z-abcd")
    with pytest.raises(api.InventoryError, match="file not found"):
        api.up(tmp_path / "missing.toml")


def test_the_stable_names_are_exported() -> None:
    """docs/api.md promises exactly these; a name dropped or added changes the promise."""
    assert sorted(api.__all__) == sorted(
        [
            *("plan", "check", "up", "attach", "Run", "Result", "TaskState", "LogLine"),
            *("PullResult", "Plan", "Task", "View", "PlainView", "TaskRow", "InventoryLike"),
            *("TfdeployError", "UsageError", "InventoryError", "LocalError", "HostError"),
            *("HostsFailed", "NetworkBlocked", "JobFailed", "Interrupted", "ExitStatus"),
            *("status", "read_logs", "down", "pull", "tunnel", "execute", "terminal_view"),
            *("RunsFound", "Forward", "Executed", "environments", "profile", "Profiled"),
            *("tensorboard", "Board"),
        ]
    )
    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert all(f"`{name}`" in docs for name in api.__all__)

    assert all(getattr(api, name) is not None for name in api.__all__)  # each one resolves
    assert set(api.__all__) <= set(dir(api))


def test_commands_other_than_up_do_not_import_the_deploy_machinery() -> None:
    """deployer.api resolves its names at first use: `tfdeploy pull` (and every command but
    up/check/plan) starts ~45 ms sooner without the push, the live view and the deployment.
    In a process of its own: this one imported everything already."""
    script = """
import sys
import deployer.cli.main
from deployer.api import PullResult, TfdeployError
loaded = [m for m in ("deployer.up.deployment", "deployer.push.fanout") if m in sys.modules]
from deployer.api import up
print(loaded, "deployer.up.deployment" in sys.modules, up.__module__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "deployer.api.deploy"]


def tasks_job(tmp: Path, tasks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    spec = job(tmp, "true", **extra)
    spec["hosts"][0]["tasks"] = tasks
    return spec


def test_wait_returns_when_the_awaited_tasks_end_and_down_stops_the_rest(tmp_path: Path) -> None:
    """An evaluator is never awaited: `wait` returns without it, `down` stops it."""
    spec = tasks_job(
        tmp_path,
        [
            {"role": "worker", "command": "sh -c 'sleep 1'"},
            {"role": "evaluator", "command": "sleep 60"},
        ],
        keeper=False,  # a kept run is waited for to its keeper's end (tests/integration)
    )
    run = api.up(spec, base=tmp_path, detach=True)
    result = run.wait(timeout=60, interval=0.2)
    assert [(t.task, t.awaited, t.state) for t in result.tasks] == [
        ("evaluator:0", False, "running"),
        ("worker:0", True, "exited"),
    ]
    assert result.succeeded
    assert run.down() == ("local",)
    assert [t.state for t in run.status()] == ["exited", "exited"]


@pytest.mark.names_tf(reason="plans `tfdeploy:server`; the worker that runs is the stand-in")
def test_a_worker_running_the_built_in_server_is_not_awaited(tmp_path: Path) -> None:
    """ParameterServerStrategy's workers are bare servers that never end: `wait` must not wait
    for them, whether the handle comes from `up` or from the run id alone. Both handles are
    those made for the job that names `tfdeploy:server` (`up`'s from its plan, `attach`'s from
    the inventory); the run's worker is the TF-shaped stand-in, serving its port until stopped:
    no TensorFlow (issue 61; the real server runs in test_seed_programs' PSS test)."""
    served = tasks_job(
        tmp_path,
        [
            {"role": "chief", "command": "true"},
            {"role": "worker", "command": "tfdeploy:server"},
        ],
        keeper=False,  # a kept run's keeper stops the server once the chief is done
    )
    inventory = load(served, base=tmp_path)
    plan = make_plan(inventory)
    assert [(t.name, t.awaited) for t in plan.tasks] == [("chief:0", True), ("worker:0", False)]
    running = copy.deepcopy(served)  # the same job, its server the stand-in
    running["hosts"][0]["tasks"][1]["command"] = f"{sys.executable} {standin.NAME} 1 --interval 600"
    standin.write(tmp_path / "code")
    run = api.up(running, base=tmp_path, detach=True)
    try:
        up_handle = started(plan, run.id, inventory)  # what `up` returns for the served job
        for handle in (up_handle, api.attach(run.id, inventory=served, base=tmp_path)):
            result = handle.wait(timeout=60, interval=0.2)
            assert [(t.task, t.awaited, t.state) for t in result.tasks] == [
                ("chief:0", True, "exited"),
                ("worker:0", False, "running"),
            ]
    finally:
        assert run.down() == ("local",)


def test_check_starts_nothing_and_a_host_failing_preflight_is_hosts_failed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert api.check(job(tmp_path, "true"), base=tmp_path) is None
    assert capfd.readouterr() == ("", "")
    broken = job(tmp_path, "true", python=str(tmp_path / "no-such-python"))
    with pytest.raises(api.HostsFailed) as caught:
        api.check(broken, base=tmp_path)
    assert [f.host for f in caught.value.failures] == ["local"]
    assert caught.value.run_id is None  # nothing was started
    assert caught.value.exit_status == api.ExitStatus.UNREACHABLE


class Recorder:
    """A caller's own view: the four promised methods, no `phase` (a view written before it)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def step(self, text: str) -> None:
        self.events.append(("step", text))

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self.events += [("line", f"{label} | {line}") for line in lines]

    def tasks(self, rows: Sequence[api.TaskRow]) -> None:
        self.events += [("task", f"{row.label} {row.state}") for row in rows]

    def close(self) -> None:
        self.events.append(("close", None))


def test_a_view_of_the_four_promised_methods_gets_every_event_and_is_closed_once(
    tmp_path: Path,
) -> None:
    view = Recorder()
    api.up(job(tmp_path, "sh -c 'echo hi'"), base=tmp_path, view=view)
    assert ("line", "worker:0@local | hi") in view.events
    assert ("task", "worker:0@local exited") in view.events
    steps = [str(text) for kind, text in view.events if kind == "step"]
    assert any(text.startswith("preflight ok") for text in steps), steps
    assert [kind for kind, _ in view.events].count("close") == 1
    assert view.events[-1] == ("close", None)
