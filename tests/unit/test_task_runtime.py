"""What a task runs in reaches its start request as one value (deployer/hosts/task_runtime.py):
the fields the supervisor reads (remote/taskops.py) and the Python a TF server task starts with."""

from __future__ import annotations

from deployer.hosts.task_runtime import TaskRuntime
from remote import protocol

CONTAINER: protocol.ContainerShape = {
    "image": "job/img:1",
    "runtime": "podman",
    "rootless": False,
    "mounts": [],
    "gpus": [0],
}


def _item(runtime: TaskRuntime) -> protocol.StartTask:
    item: protocol.StartTask = {"name": "ps:0", "command": "x", "env": {}}
    runtime.apply(item)
    return item


def test_the_host_python_is_sent_as_python_and_starts_servers() -> None:
    runtime = TaskRuntime("/usr/bin/python3")
    assert _item(runtime) == {
        "name": "ps:0",
        "command": "x",
        "env": {},
        "python": "/usr/bin/python3",
    }
    assert (
        runtime.server_command("/wd/agent/a1") == "exec /usr/bin/python3 /wd/agent/a1/tfserver.py"
    )


def test_a_venv_replaces_the_host_python_everywhere() -> None:
    runtime = TaskRuntime("/usr/bin/python3", venv="/wd/envs/abc")
    assert _item(runtime) == {"name": "ps:0", "command": "x", "env": {}, "venv": "/wd/envs/abc"}
    assert runtime.interpreter == "/wd/envs/abc/bin/python"
    assert runtime.setup_fields() == {"venv": "/wd/envs/abc"}


def test_an_image_runs_servers_on_its_own_python_and_setup_outside_it() -> None:
    runtime = TaskRuntime("/usr/bin/python3").in_container(CONTAINER)
    item = _item(runtime)
    assert item.get("container") == CONTAINER
    assert item.get("python") == "/usr/bin/python3"
    assert runtime.interpreter == "python3"
    assert runtime.setup_fields() == {"python": "/usr/bin/python3"}
