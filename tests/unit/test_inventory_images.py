"""The container image's inventory keys (issue 42): image (job, host, role), image_from,
container_runtime, container_mounts; their defaults, their mistakes, the refusal of image with
requirements; and what a task's container is (its start request's `container`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.model import ImageFrom
from deployer.core.errors import ExitStatus, InventoryError
from deployer.up.images import Images, images_by_host, task_image
from remote import containers
from tests.support.helpers import JOB, TWO_HOSTS, load, plan, write_toml


def test_defaults_no_image(tmp_path: Path) -> None:
    inv = load(tmp_path, JOB + TWO_HOSTS.replace('image = "host/img:2"\n', ""))
    job = inv.job
    assert job.image is None and job.role_images == {} and job.container_mounts == ()
    assert job.image_from is ImageFrom.HOSTS and job.container_runtime is None
    assert (
        images_by_host(plan(tmp_path, JOB + TWO_HOSTS.replace('image = "host/img:2"\n', ""))) == {}
    )


def test_job_host_and_role_images(tmp_path: Path) -> None:
    text = (
        JOB
        + 'image = "job/img:1"\nimage_from = "controller"\n'
        + 'role_images = { evaluator = "eval/img:3" }\n'
        + 'container_mounts = ["/data", "/opt/tools:ro"]\n'
        + TWO_HOSTS
    )
    the_plan = plan(tmp_path, text)
    job, (h1, h2) = the_plan.job, the_plan.hosts
    assert job.image_from is ImageFrom.CONTROLLER
    assert job.container_mounts == ("/data", "/opt/tools:ro")
    assert h1.image == "job/img:1" and h2.image == "host/img:2"
    assert h1.container_runtime is None and h2.container_runtime == "docker"
    by_task = {t.name: task_image(the_plan, t) for t in the_plan.tasks}
    assert by_task == {
        "chief:0": "job/img:1",
        "evaluator:0": "eval/img:3",
        "worker:0": "host/img:2",
    }
    assert images_by_host(the_plan) == {
        h1.name: ["job/img:1", "eval/img:3"],
        h2.name: ["host/img:2"],
    }


def test_a_tasks_container_carries_its_image_runtime_mounts_and_gpus(tmp_path: Path) -> None:
    text = JOB + 'image = "job/img:1"\ncontainer_mounts = ["/data:ro"]\n' + TWO_HOSTS
    the_plan = plan(tmp_path, text)
    images = Images(the_plan)
    reply = {
        "runtime": "podman",
        "rootless": True,
        "platform": "linux/amd64",
        "present": True,
        "pulled": False,
        "image_platform": "linux/amd64",
    }
    images.checked = {
        h.name: {i: dict(reply) for i in ("job/img:1", "host/img:2")} for h in the_plan.hosts
    }  # type: ignore[misc]
    chief = next(t for t in the_plan.tasks if t.role == "chief")
    assert images.container(chief) == {
        "image": "job/img:1",
        "runtime": "podman",
        "rootless": True,
        "mounts": ["/data:ro"],
        "gpus": [],
    }


def test_a_read_only_mount_is_a_read_only_volume() -> None:
    argv = containers.run_argv(
        "podman",
        image="i:1",
        run_id="r",
        task="worker:0",
        command="true",
        env={},
        mounts=["/w", "/data:ro"],
        cwd="/w",
        uid=1,
        gid=1,
    )
    assert "/w:/w" in argv and "/data:/data:ro" in argv


def test_image_with_requirements_for_one_task_is_refused(tmp_path: Path) -> None:
    text = JOB + 'image = "job/img:1"\nrequirements = ["six"]\n' + TWO_HOSTS
    with pytest.raises(InventoryError) as caught:
        plan(tmp_path, text)
    said = str(caught.value)
    assert "both an image and requirements" in said and "10.0.0.1 (chief)" in said
    assert "install the requirements in the image" in (caught.value.hint or "")
    assert caught.value.exit_status is ExitStatus.USAGE


@pytest.mark.parametrize(
    ("extra", "key", "said"),
    [
        ('image = "-rm"\n', "job.image", "expected an image name"),
        ('image = "a b"\n', "job.image", "expected an image name"),
        ('image_from = "registry"\n', "job.image_from", "controller"),
        ('container_runtime = "lxc"\n', "job.container_runtime", "podman"),
        ('container_mounts = ["data"]\n', "job.container_mounts", "absolute paths"),
        ('role_images = { boss = "x:1" }\n', "job.role_images.boss", "expected one of the roles"),
    ],
)
def test_mistakes_name_the_key(tmp_path: Path, extra: str, key: str, said: str) -> None:
    with pytest.raises(InventoryError) as caught:
        from deployer.config.inventory import load_inventory

        load_inventory(write_toml(tmp_path, JOB + extra + TWO_HOSTS))
    assert key in str(caught.value) and said in str(caught.value)
