"""remote/containers.py as argv: what tfdeploy asks a runtime for. The parts that cannot run on
this machine (docker's engine, GPU flags through CDI or --gpus) are tested only here, as the argv
built; tests/integration/test_containers.py runs the rest with real podman in lab hosts."""

from __future__ import annotations

import pytest

from remote import containers

RUN = dict(
    image="localhost/job:1",
    run_id="r20240101-abc",
    task="worker/1",
    command="python3 train.py --steps 5",
    env={"TF_CONFIG": '{"task": {"type": "worker", "index": 1}}', "TFDEPLOY_RUN": "r"},
    mounts=["/home/u/.tfdeploy/runs/r/code", "/home/u/.tfdeploy"],
    cwd="/home/u/.tfdeploy/runs/r/code",
    uid=1001,
    gid=1002,
)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_podman_run_argv_names_labels_host_network_mounts_env_and_user() -> None:
    argv = containers.run_argv("podman", **RUN)
    assert argv[:3] == ["podman", "run", "--init"]
    assert "--rm" not in argv  # kept until its exit is recorded, then removed by name
    assert _pairs(argv, "--name") == ["tfdeploy-r20240101-abc-worker-1"]
    assert _pairs(argv, "--label") == ["tfdeploy.run=r20240101-abc", "tfdeploy.task=worker/1"]
    assert _pairs(argv, "--network") == ["host"]
    assert _pairs(argv, "--workdir") == [RUN["cwd"]]
    assert _pairs(argv, "--user") == ["1001:1002"]
    assert _pairs(argv, "--volume") == [f"{m}:{m}" for m in RUN["mounts"]]
    assert sorted(_pairs(argv, "--env")) == sorted(RUN["env"])  # names; values: client_env
    assert argv[-4:] == ["localhost/job:1", "/bin/sh", "-c", RUN["command"]]
    assert "--device" not in argv and "--gpus" not in argv


def test_rootless_podman_maps_the_login_user_onto_itself() -> None:
    """Under rootless podman a `--user` uid is a subordinate uid outside: files in mounts would
    not be the login user's. keep-id maps the login user onto itself instead."""
    argv = containers.run_argv("podman", **RUN, rootless=True)
    assert _pairs(argv, "--userns") == ["keep-id"]
    assert "--user" not in argv


def test_podman_gpus_through_cdi_one_device_each_and_renumbered_inside() -> None:
    env = {**RUN["env"], "CUDA_VISIBLE_DEVICES": "2,5"}
    argv = containers.run_argv("podman", **{**RUN, "env": env}, gpus=[2, 5])
    assert _pairs(argv, "--device") == ["nvidia.com/gpu=2", "nvidia.com/gpu=5"]
    # The container has only GPUs 2 and 5, numbered 0 and 1 inside.
    assert "CUDA_VISIBLE_DEVICES" in _pairs(argv, "--env")
    assert containers.client_env({}, env, [2, 5])["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_no_value_of_the_tasks_environment_stands_in_the_command_line() -> None:
    """Every user of a host reads a process's command line in /proc: a secret_env token or
    TF_CONFIG passed as `--env K=V` would be theirs. The client's environment carries them."""
    env = {**RUN["env"], "API_TOKEN": "tok-SECRET-value"}
    for runtime in ("podman", "docker"):
        argv = containers.run_argv(runtime, **{**RUN, "env": env}, gpus=[0])
        assert not [a for a in argv if "tok-SECRET-value" in a or "TF_CONFIG=" in a], argv
        client = containers.client_env({"PATH": "/usr/bin"}, env, [0])
        assert client["API_TOKEN"] == "tok-SECRET-value" and client["PATH"] == "/usr/bin"
        assert client["TF_CONFIG"] == env["TF_CONFIG"]


def test_docker_gpus_flag_names_the_device_indices() -> None:
    argv = containers.run_argv("docker", **RUN, gpus=[0, 3])
    assert argv[:3] == ["docker", "run", "--init"]
    # As the shell form `--gpus '"device=0,3"'`: docker parses the value as CSV.
    assert _pairs(argv, "--gpus") == ['"device=0,3"']
    assert "--device" not in argv
    assert _pairs(argv, "--user") == ["1001:1002"]  # docker: rootful, --user as for podman


def test_no_gpus_keeps_the_environment_as_planned() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "-1"}
    assert containers.task_env(env, []) == env
    assert containers.gpu_flags("podman", []) == []


@pytest.mark.parametrize(
    ("status", "code"),
    [(0, 0), (7, 7), (125, 125), (128, 128), (137, -9), (143, -15), (192, -64), (193, 193)],
)
def test_the_clients_status_is_the_tasks_with_128_plus_n_a_signal(status: int, code: int) -> None:
    assert containers.returncode(status) == code


def test_platforms_are_compared_in_the_images_words() -> None:
    assert containers.normalize_platform("linux/x86_64") == "linux/amd64"
    assert containers.normalize_platform("Linux/aarch64") == "linux/arm64"
    assert containers.normalize_platform("linux/amd64") == "linux/amd64"


def test_a_missing_runtime_is_found_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert containers.find_runtime() is None
    assert containers.find_runtime("docker") is None
    code, _, err = containers._run(["podman", "info"])
    assert code == 127 and "not found" in err
