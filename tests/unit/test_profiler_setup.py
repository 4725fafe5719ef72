"""What `[job] profiler` sets up before `tfdeploy profile` runs (docs/profile.md): each TF task's
port and variables in the plan, the starter the agent puts first on a task's PYTHONPATH, and the
`profile` op's answers for tasks it cannot trace. The traces themselves, by real TensorFlow, are
tests/integration/test_profile.py's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from remote import protocol
from tests.support.agent import call, new_run, ok, start
from tests.support.helpers import JOB, plan, plan_error

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "remote"))
from taskmetrics import task_env

TWO_HOSTS = """
[[hosts]]
name = "h1"
address = "203.0.113.11"
port = 9012
tasks = [{ role = "chief" }, { role = "worker" }, { role = "evaluator" }]

[[hosts]]
name = "h2"
address = "203.0.113.12"
tasks = [{ role = "worker" }, { role = "ps" }]
"""


def job(extra: str) -> str:
    return JOB + extra + TWO_HOSTS


def ports(text: str, tmp_path: Path) -> dict[str, tuple[int | None, str | None]]:
    planned = plan(tmp_path, text)
    return {
        t.name: (t.profiler_port, t.env.get(protocol.PROFILER_START_ENV)) for t in planned.tasks
    }


def test_each_tf_task_gets_a_port_of_its_own_skipping_the_hosts_tf_ports(tmp_path: Path) -> None:
    # h1's TF ports are 9012 and 9013 (its `port`): its profiler ports go around them.
    assert ports(job("profiler = true\n"), tmp_path) == {
        "chief:0": (9014, "tfdeploy"),
        "worker:0": (9015, "tfdeploy"),
        "evaluator:0": (9016, "tfdeploy"),
        "worker:1": (9012, "tfdeploy"),
        "ps:0": (9013, "tfdeploy"),
    }
    planned = plan(tmp_path, job('profiler = "task"\nprofiler_port = 7000\n'))
    assert planned.task("worker:1").env[protocol.PROFILER_PORT_ENV] == "7000"
    assert planned.task("worker:1").env[protocol.PROFILER_START_ENV] == "task"


def test_without_the_profiler_no_task_gets_a_port_or_a_variable(tmp_path: Path) -> None:
    planned = plan(tmp_path, job(""))
    assert all(t.profiler_port is None for t in planned.tasks)
    assert not any(protocol.PROFILER_PORT_ENV in t.env for t in planned.tasks)


def test_a_task_of_another_framework_serves_no_profiler(tmp_path: Path) -> None:
    text = (
        JOB
        + 'profiler = true\nframework = "torch"\n'
        + (
            '\n[[hosts]]\nname = "h1"\naddress = "203.0.113.11"\n'
            'tasks = [{ role = "chief" }, { role = "worker" }]\n'
        )
    )
    assert all(t.profiler_port is None for t in plan(tmp_path, text).tasks)


@pytest.mark.parametrize(
    "extra, key, expected",
    [
        ('profiler = "yes"\n', "job.profiler", "expected 'off' or 'tfdeploy' or 'task'"),
        ("profiler = true\nprofiler_port = 65535\n", "job.profiler_port", "above 65535"),
        ("profiler_port = 0\n", "job.profiler_port", "at least 1"),
    ],
)
def test_profiler_mistakes_name_the_key(
    tmp_path: Path, extra: str, key: str, expected: str
) -> None:
    error = plan_error(tmp_path, job(extra))
    assert error.key == key
    assert expected in str(error)


def test_the_profiler_variables_cannot_be_set_by_hand(tmp_path: Path) -> None:
    for name in (protocol.PROFILER_PORT_ENV, protocol.PROFILER_START_ENV):
        error = plan_error(tmp_path, job(f'env = {{ {name} = "1" }}\n'))
        assert name in str(error)


def _python_with(lib: Path, env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_starter_goes_first_on_the_path_only_when_tfdeploy_starts_the_server(
    tmp_path: Path,
) -> None:
    on = {protocol.PROFILER_PORT_ENV: "9012", protocol.PROFILER_START_ENV: "tfdeploy"}
    first = tmp_path / "a"
    first.mkdir()
    env = task_env(first, on)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(first / "lib")
    assert (first / "lib" / "sitecustomize.py").is_file()
    second = tmp_path / "b"
    second.mkdir()
    task_env(second, {**on, protocol.PROFILER_START_ENV: "task"})
    assert not (second / "lib" / "sitecustomize.py").exists()


def test_the_starter_runs_the_sitecustomize_it_hides_and_waits_for_tensorflow(
    tmp_path: Path,
) -> None:
    """A Python of the task runs the distribution's sitecustomize as before, starts no server
    while it has not imported TensorFlow, and ends as it would have (the thread is a daemon)."""
    task = tmp_path / "task"
    task.mkdir()
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['HIDDEN_RAN'] = 'yes'\n")
    env = task_env(task, {protocol.PROFILER_PORT_ENV: "9", protocol.PROFILER_START_ENV: "tfdeploy"})
    env["PYTHONPATH"] += os.pathsep + str(own)
    code = (
        "import os, sys, threading\n"
        "print(os.environ.get('HIDDEN_RAN'), 'tensorflow' in sys.modules,\n"
        "      [t.name for t in threading.enumerate() if t.name.startswith('tfdeploy')])\n"
    )
    done = _python_with(task, env, code)
    assert done.stdout.split("\n")[0] == "yes False ['tfdeploy-profiler']"
    assert done.stderr == ""


def test_the_profile_op_names_each_task_it_cannot_trace(workdir: Path) -> None:
    """No TensorFlow needed: a task without a profiler port, one whose port nobody serves, and
    one that has ended are each answered with why, none traced."""
    new_run(workdir)
    serving = {protocol.PROFILER_PORT_ENV: "1", protocol.PROFILER_START_ENV: "tfdeploy"}
    start(
        workdir,
        {"name": "worker:0", "command": "sleep 30", "env": serving},
        {"name": "evaluator:0", "command": "sleep 30"},
        {"name": "chief:0", "command": "exit 0", "env": serving},
    )
    reply = ok(call(workdir, "profile", run_id="r1", seconds=1, start_in=0, stamp="s1"))
    got = {t["name"]: (t["serves"], t["traced"], t["why"]) for t in reply["tasks"]}
    assert got["evaluator:0"][:2] == (False, False)
    assert "serves no profiler" in got["evaluator:0"][2]
    assert got["worker:0"][:2] == (True, False)
    assert "nothing listens on its profiler port 1" in got["worker:0"][2]
    chief = got["chief:0"]
    assert chief[:2] == (True, False) and chief[2] in ("it is not running (exited)",)
    refused = call(workdir, "profile", run_id="r1", seconds=0, start_in=0, stamp="s1")
    assert refused["ok"] is False and "seconds must be above 0" in refused["error"]
    bad_stamp = call(workdir, "profile", run_id="r1", seconds=1, start_in=0, stamp="../x")
    assert bad_stamp["ok"] is False and "stamp" in bad_stamp["error"]


def test_tensorboard_refuses_a_port_in_use_before_asking_any_host() -> None:
    from deployer.api import UsageError, tensorboard

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(UsageError, match=f"port {port} is in use"),
            tensorboard("no-such-run", port=port),
        ):
            pass
