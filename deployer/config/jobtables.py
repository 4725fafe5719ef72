"""The job's tables by role and by host: container images, frameworks, requirements, mounts; and
the idle-GPU guard's table.

Each reads one key of an inventory table (config/schema.py) into the model's value, with the
inventory's file, key and fix in every error; inventory.py calls them for [job] and [[hosts]].
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from deployer.config import containers
from deployer.config.frameworks import Framework
from deployer.config.model import GpuIdleStop, Requirements
from deployer.config.roles import ROLE_NAMES, TF_ROLES
from deployer.config.schema import Table


def image(t: Table, key: str) -> str | None:
    """An image reference (`NAME:TAG`, `registry/name@sha256:...`), as the runtime takes it."""
    value = t.string(key)
    if value is not None and (not value or value.startswith("-") or re.search(r"\s", value)):
        t.fail(key, f"expected an image name such as tensorflow/tensorflow:2.16.1, got {value!r}")
    return value


def role_frameworks(t: Table) -> dict[str, Framework]:
    """`role_frameworks = { evaluator = "tensorflow" }`: a role that reads another convention
    than the job's `framework`."""
    roles = t.sub_table("role_frameworks")
    read = {r: Framework(roles.choice(r, list(Framework), "")) for r in roles.written_keys()}
    for role in read:
        if role not in TF_ROLES:
            t.fail(f"role_frameworks.{role}", f"expected one of the roles {', '.join(ROLE_NAMES)}")
    roles.finish()
    return read


def role_images(t: Table) -> dict[str, str]:
    """`role_images = { evaluator = "eval:1" }`: a role's own image."""
    roles = t.sub_table("role_images")
    read = {role: image(roles, role) or "" for role in roles.written_keys()}
    for role in read:
        if role not in TF_ROLES:
            t.fail(f"role_images.{role}", f"expected one of the roles {', '.join(ROLE_NAMES)}")
    roles.finish()
    return read


def container_runtime(t: Table) -> str | None:
    value = t.string("container_runtime")  # read even when absent: a typo gets its "did you mean"
    if value is not None and value not in ("podman", "docker"):
        t.fail("container_runtime", f"expected podman or docker, got {value!r}")
    return value


def mounts(t: Table) -> tuple[str, ...]:
    """Host paths mounted into each task's container at the same path; `PATH:ro` read-only.
    Normalised (`/data/` and `/data//x` are `/data` and `/data/x`), and refused here when the
    runtime would refuse them at start or the container could not run (containers.py)."""
    return tuple(dict.fromkeys(_mount(t, mount) for mount in t.string_list("container_mounts")))


def _mount(t: Table, mount: str) -> str:
    path, read_only = (mount[:-3], True) if mount.endswith(":ro") else (mount, False)
    if not path.startswith("/") or ":" in path or "," in path:
        t.fail(
            "container_mounts",
            f"expected absolute paths, optionally ending in :ro, got {mount!r}",
        )
    problem = containers.mount_problem(path)
    if problem is not None:
        t.fail(
            "container_mounts",
            f"{mount!r} {problem}",
            hint="mount the folder the tasks need (`/data`, `/opt/tools:ro`); the runtime gives "
            "every container its own /proc, /sys and /dev",
        )
    return "/" + posixpath.normpath(path).lstrip("/") + (":ro" if read_only else "")


def requirements(t: Table, key: str, code: Path) -> Requirements:
    """A requirements file relative to `code` (it must exist), or the requirement lines."""
    value = t.string_or_list(key)
    if isinstance(value, str) and not (code / value).is_file():
        t.fail(
            key,
            f"expected a requirements file relative to `code`, but {code / value} is not a file",
        )
    return value


def role_requirements(t: Table, code: Path) -> dict[str, Requirements]:
    """`role_requirements = { evaluator = "eval.txt" }`: a role's own environment."""
    roles = t.sub_table("role_requirements")
    read = {role: requirements(roles, role, code) for role in roles.written_keys()}
    for role in read:
        if role not in TF_ROLES:
            t.fail(
                f"role_requirements.{role}", f"expected one of the roles {', '.join(ROLE_NAMES)}"
            )
    roles.finish()
    return read


def gpu_idle_stop(t: Table) -> GpuIdleStop | None:
    """`gpu_idle_stop = { below = 5, minutes = 30 }`: both required, the floor a utilization in
    percent above 0 (a GPU at 0 % is below any), the window a positive number of minutes."""
    guard = t.sub_table("gpu_idle_stop")  # read even when absent: a typo gets its "did you mean"
    if not t.has("gpu_idle_stop"):
        return None
    example = "e.g. gpu_idle_stop = { below = 5, minutes = 30 }"
    below = guard.number("below", None)
    minutes = guard.number("minutes", None)
    guard.finish()  # a misspelt key first: its "did you mean" says more than what is missing
    if below is None or minutes is None:
        guard.fail("below" if below is None else "minutes", f"is missing: {example}")
    if not 0 < below <= 100:
        guard.fail(
            "below", f"expected a utilization in percent above 0 and at most 100, got {below:g}"
        )
    if minutes <= 0:
        guard.fail(
            "minutes", f"expected a window of more than 0 minutes ({example}), got {minutes:g}"
        )
    return GpuIdleStop(below=below, minutes=minutes)
