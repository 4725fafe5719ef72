"""The job's container images in `up` (docs/containers.md): checked on every host in preflight,
pulled by the hosts or sent from here, and the container each task runs in.

- `Images.check`, after preflight's hellos and before anything is sent: the `image` op's check on
  every host with an image task: runtime usable by the login user, GPU runtime for GPU tasks,
  image present (with `image_from = "hosts"` pulled now, once per host) and of the host's
  platform, and one throwaway container of it run as a task's would be (a runtime that cannot
  create containers fails here, not at start), which reads the image's TensorFlow and
  frameworks. With `image_from = "controller"` an image some host lacks is saved here once as an
  OCI layout (deployer/envs/images.py) and its platform checked against those hosts'; its trial
  container runs after the load.
- `Images.extras`: the layout's blobs, contents of the push like the environment's wheels: the
  store dedupes them by digest, so a re-deploy sends only the layers a host's store lacks.
- `Images.load`, after the push: the `image` op's load on the hosts that lack the image.
- `Images.where`: a task's `container` for its start request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from deployer.config.containers import image_of
from deployer.config.model import ImageFrom
from deployer.config.plan import Plan, Task
from deployer.core.errors import HostError, HostsFailed
from deployer.core.statedir import state_dir
from deployer.core.text import human_size, join_names, plural
from deployer.envs import images as oci
from deployer.hosts.fleet import Fleet, Member
from deployer.push.sync import CodeFile
from deployer.up.environment import python_words
from remote import protocol

PULL_TIMEOUT_S = 1800.0  # a few GB of layers over a host's own link
LOAD_TIMEOUT_S = 1800.0


def task_image(plan: Plan, task: Task) -> str | None:
    host = next(h for h in plan.hosts if h.name == task.host)
    return image_of(plan.job, host, task.role)


def images_by_host(plan: Plan) -> dict[str, list[str]]:
    """Each host's images (of its tasks), in first-use order; hosts without one are absent."""
    found: dict[str, list[str]] = {}
    for task in plan.tasks:
        image = task_image(plan, task)
        if image is not None and image not in found.setdefault(task.host, []):
            found[task.host].append(image)
    return {h: i for h, i in found.items() if i}


@dataclass
class Images:
    """Every host's images for one `up`, where they come from, and how each host runs them."""

    plan: Plan
    # host -> image -> its check's (or load's) reply: with the trial's `tensorflow` and
    # `frameworks`, which the TensorFlow and framework rules read (tfrule.py, frameworkrule.py)
    checked: dict[str, dict[str, protocol.ImageReply]] = field(default_factory=dict)
    layouts: dict[str, oci.OciLayout] = field(default_factory=dict)  # image -> saved here

    @property
    def any(self) -> bool:
        return bool(images_by_host(self.plan))

    def check(self, fleet: Fleet, members: Sequence[Member], run_id: str) -> list[str]:
        """The check on every host with an image; raises HostsFailed (nothing started)."""
        wanted = images_by_host(self.plan)
        job = self.plan.job
        pull = job.image_from is ImageFrom.HOSTS

        def on(member: Member) -> dict[str, protocol.ImageReply]:
            gpus = any(t.gpus for t in self.plan.tasks_on(member.name))
            replies = {}
            for image in wanted[member.name]:
                request: protocol.ImageRequest = {
                    "run_id": run_id,
                    "action": protocol.IMAGE_CHECK,
                    "image": image,
                    "gpus": gpus,
                    "pull": pull,
                    "mounts": list(job.container_mounts),
                    "pythons": self._pythons(member.name, image),
                }
                if member.host.container_runtime:
                    request["runtime"] = member.host.container_runtime
                replies[image] = member.agent.image(request, PULL_TIMEOUT_S)
            return replies

        with_image = [m for m in members if m.name in wanted]
        self.checked = fleet.each(on, with_image, what="the job's container image failed")
        lines = self._missing() if pull else self._export()
        for image in sorted({i for images in wanted.values() for i in images}):
            hosts = [h for h, r in self.checked.items() if image in r]
            runtimes = sorted({r[image]["runtime"] for r in self.checked.values() if image in r})
            pulled = [h for h in hosts if self.checked[h][image]["pulled"]]
            said = f", pulled on {join_names(pulled)}" if pulled else ""
            tried = [h for h in hosts if self.checked[h][image].get("tried")]
            said += f"; a trial container ran on {join_names(tried)}" if tried else ""
            lines.insert(0, f"image {image} on {join_names(hosts)} ({'/'.join(runtimes)}){said}")
        return lines

    def _missing(self) -> list[str]:
        """With the hosts pulling: an image a host neither has nor could pull fails."""
        problems = [
            HostError(
                host,
                f"image {image} is not on this host",
                hint="push it to a registry the host can pull from, or set "
                'image_from = "controller" to send it from here',
            )
            for host, replies in sorted(self.checked.items())
            for image, reply in replies.items()
            if not reply["present"]
        ]
        if problems:
            raise HostsFailed(problems)
        return []

    def _export(self) -> list[str]:
        """With `image_from = "controller"`: each image some host lacks is saved here once
        and its platform checked against theirs; hosts that have it are left as they are."""
        lacking = self.lacking()
        lines = []
        problems = []
        for image in sorted({i for images in lacking.values() for i in images}):
            layout = oci.export_oci(image, state_dir() / "images")
            self.layouts[image] = layout
            have = oci.image_platform(image)
            for host in lacking:
                platform = self.checked[host][image]["platform"]
                if image in lacking[host] and platform != have:
                    problems.append(
                        HostError(
                            host,
                            f"image {image} is built for {have}, this host is {platform}",
                            hint=f"build the {platform} variant here (podman build --platform "
                            f"{platform}) and deploy that",
                        )
                    )
            hosts = [h for h, i in lacking.items() if image in i]
            lines.append(
                f"image {image} ({layout.image_id[:12]}, {plural(len(layout.blobs), 'blob')}, "
                f"{human_size(layout.size)}) to be sent to {join_names(hosts)}"
            )
        if problems:
            raise HostsFailed(problems)
        return lines

    def _pythons(self, host: str, image: str) -> list[str]:
        """The first words of the host's tasks in `image` that name a Python: the trial reads
        the TensorFlow of the interpreter the tasks will run."""
        tasks = [t for t in self.plan.tasks_on(host) if task_image(self.plan, t) == image]
        return python_words(tasks)

    def lacking(self) -> dict[str, list[str]]:
        """The images each host lacks (after the check), hosts that lack none absent."""
        out = {
            host: [image for image, r in replies.items() if not r["present"]]
            for host, replies in self.checked.items()
        }
        return {h: i for h, i in out.items() if i}

    def extras(self) -> tuple[CodeFile, ...]:
        """The saved layouts' blobs as contents of the push (stored, placed nowhere)."""
        found: dict[str, CodeFile] = {}
        for layout in self.layouts.values():
            for blob in layout.blobs:
                digest = blob.digest.removeprefix("sha256:")
                path = str(layout.path / "blobs" / "sha256" / digest)
                found.setdefault(digest, CodeFile(path, digest, 0o644, blob.size))
        return tuple(found[k] for k in sorted(found))

    def needs(self) -> dict[str, frozenset[str]]:
        """Each host's layers: the blobs of the images it lacks, only."""
        return {
            host: frozenset(
                blob.digest.removeprefix("sha256:")
                for image in images
                if image in self.layouts
                for blob in self.layouts[image].blobs
            )
            for host, images in self.lacking().items()
        }

    def load(self, fleet: Fleet, members: Sequence[Member], run_id: str) -> list[str]:
        """The load on each host that lacks an image; the blobs are in its store by now."""
        lacking = self.lacking()
        if not lacking or not self.layouts:
            return []

        def on(member: Member) -> None:
            for image in lacking[member.name]:
                layout = self.layouts[image]
                request: protocol.ImageRequest = {
                    "run_id": run_id,
                    "action": protocol.IMAGE_LOAD,
                    "image": image,
                    "runtime": self.checked[member.name][image]["runtime"],
                    "index": (layout.path / "index.json").read_text(),
                    "blobs": [b.digest.removeprefix("sha256:") for b in layout.blobs],
                    "mounts": list(self.plan.job.container_mounts),
                    "pythons": self._pythons(member.name, image),
                }
                reply = member.agent.image(request, LOAD_TIMEOUT_S)
                self.checked[member.name][image] = reply

        chosen = [m for m in members if m.name in lacking]
        fleet.each(on, chosen, what="loading the job's container image failed")
        return [f"image loaded on {join_names(sorted(lacking))}"]

    def container(self, task: Task) -> protocol.ContainerShape | None:
        """The task's `container` for its start request; None for a task outside an image."""
        image = task_image(self.plan, task)
        if image is None or task.host not in self.checked:
            return None
        reply = self.checked[task.host][image]
        container: protocol.ContainerShape = {
            "image": image,
            "runtime": reply["runtime"],
            "rootless": reply["rootless"],
            "mounts": list(self.plan.job.container_mounts),
            "gpus": list(task.gpus),
        }
        return container
