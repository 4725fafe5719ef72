"""Which container image a task runs in (`image`, per host and per role), and the one rule a
single key cannot express: a task with an image has no `requirements` (docs/containers.md)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from deployer.config.model import Host, Job
from deployer.core.errors import InventoryError

# What the runtime mounts into every container itself: a `container_mounts` path on or under
# these would hide the container's own (runc refuses /proc over a host path; a host /sys or /dev
# over the container's breaks the image's view of its own devices and cgroups). Folders under
# /dev (/dev/shm, /dev/infiniband) are the user's to share.
RUNTIME_OWNED = ("/proc", "/sys", "/dev")


def mount_problem(path: str) -> str | None:
    """Why a `container_mounts` path cannot be mounted at the same path inside, or None."""
    if ".." in path.split("/"):
        return (
            "contains `..`: a mount is the same path inside and out, and `..` makes that path "
            "something else than it reads"
        )
    norm = "/" + posixpath.normpath(path).lstrip("/")
    if norm == "/":
        return (
            "is the host's whole file system: mounted over the container's root, the image's "
            "own files would be hidden and the task could not start"
        )
    for owned in RUNTIME_OWNED:
        if norm == owned or (owned != "/dev" and norm.startswith(owned + "/")):
            return (
                f"would shadow {owned}, which the container runtime mounts into every "
                "container itself"
            )
    return None


def image_of(job: Job, host: Host, role: str) -> str | None:
    """A task's image: its role's, else its host's (the job's unless the host says)."""
    return job.role_images.get(role) or host.image


def requirements_with_image(job: Job, host: Host, role: str) -> bool:
    """The task would run in an image and in a venv of the job's requirements at once."""
    wanted = job.role_requirements.get(role, host.requirements)
    return image_of(job, host, role) is not None and wanted is not None


def check_images(job: Job, placed: Sequence[tuple[Host, str]], file: str) -> None:
    """Refuses `image` with `requirements` for one task (InventoryError, exit 2).

    A venv is built on the host's Python and links into it; inside the image that Python is
    not there (or is another one), so the venv would not run. The image is the environment:
    its packages belong in the image.
    """
    both = sorted(
        {
            f"{host.name} ({role})"
            for host, role in placed
            if requirements_with_image(job, host, role)
        }
    )
    if both:
        raise InventoryError(
            file,
            "job.image",
            f"tasks on {', '.join(both)} have both an image and requirements; a task runs in "
            "one or the other",
            hint="install the requirements in the image (a RUN pip install line of its "
            "Containerfile), or drop `image` to run in a venv of the requirements",
        )
