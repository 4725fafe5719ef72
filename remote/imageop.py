"""The image op: the job's container image on a host, checked in preflight, loaded after a push.

- `check` (preflight, before anything starts): the runtime is installed and runs containers for
  this user, the GPU runtime is there for a host with GPU tasks, the image is in the host's
  store (pulled now with `pull`: the hosts' own registry access) and built for this host's
  platform, and one throwaway container of it, made as a task's is, runs to its end (`runtime
  info` passes on a host whose runtime cannot create a container: no cgroup mounts). That
  container also says the image's TensorFlow version and its frameworks beside it (torch, jax,
  keras: the framework rule's). Each failure is one sentence naming what to fix; nothing of the
  run starts.
- `load` (after the push, `image_from = "controller"`): the push left the image's blobs in the
  store (named by sha256, as an OCI layout names them); the layout is assembled from hard links
  into the store, loaded into the runtime's store, and removed again; then the same throwaway
  container is tried, still before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import containers
import hostfacts
import layout
import params
import procs
import protocol

# Where the runtimes find CDI specs (podman's `--device nvidia.com/gpu=I` needs one).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
# docker's `--gpus` needs the NVIDIA container toolkit: any of its programs on PATH.
TOOLKIT = ("nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-ctk")


def op_image(req: dict[str, Any]) -> protocol.ImageReply:
    params.check_name(params.param(req, "run_id", str), "run id")
    action = params.param(req, "action", str)
    image = _image_name(params.param(req, "image", str))
    runtime, info = _runtime(params.param(req, "runtime", str, None))
    pulled = False
    if action == protocol.IMAGE_CHECK:
        _remove_orphans(runtime, layout.runs_dir(layout.workdir_path(req)))
        if params.param(req, "gpus", bool, False):
            problem = gpu_runtime_problem(runtime)
            if problem:
                raise params.AgentError(problem)
        if not containers.image_exists(runtime, image) and params.param(req, "pull", bool, False):
            try:
                containers.pull(runtime, image)
            except containers.ContainerError as exc:
                raise params.AgentError(
                    f"image {image} is not on this host and cannot be pulled: {exc}"
                ) from None
            pulled = True
    elif action == protocol.IMAGE_LOAD:
        if not containers.image_exists(runtime, image):
            _load(req, runtime, image)
    else:
        raise params.AgentError(f"image action must be check or load, got {action!r:.40}")
    present = containers.image_exists(runtime, image)
    platform = str(info["platform"])
    have = containers.image_platform(runtime, image) if present else None
    if have is not None and have != platform:
        raise params.AgentError(
            f"image {image} is built for {have}, this host is {platform}: "
            f"build or pull the {platform} variant"
        )
    reply: protocol.ImageReply = {
        "runtime": runtime,
        "rootless": bool(info["rootless"]),
        "platform": platform,
        "present": present,
        "pulled": pulled,
        "image_platform": have,
    }
    if present:
        tried = _trial(req, runtime, image, bool(info["rootless"]))
        reply["tried"] = True
        reply["tensorflow"] = tried.tensorflow
        if tried.frameworks is not None:
            reply["frameworks"] = tried.frameworks
    return reply


def _trial(req: dict[str, Any], runtime: str, image: str, rootless: bool) -> containers.Trial:
    """A throwaway container of the image, as a task's would be: a runtime that cannot run
    one (no cgroup mounts, a missing init, a mount that is not there) fails here, naming the
    host, not at start as a task failure. The image's TensorFlow and frameworks, as its
    Python read them (the hello's FRAMEWORK_DISTRIBUTIONS, for the framework rule)."""
    mounts = params.param(req, "mounts", list, [])
    if not all(isinstance(m, str) and m.startswith("/") for m in mounts):
        raise params.AgentError("mounts must be absolute paths (PATH:ro)")
    pythons = params.param(req, "pythons", list, [])
    if not all(isinstance(w, str) and w and not w.startswith("-") for w in pythons):
        raise params.AgentError("pythons must be interpreter names or paths")
    workdir = str(layout.workdir_path(req))
    run_id = params.param(req, "run_id", str)
    try:
        return containers.trial(
            runtime,
            image,
            run_id=run_id,
            mounts=list(dict.fromkeys([workdir, *mounts])),
            rootless=rootless,
            pythons=pythons[:8],
            frameworks=hostfacts.FRAMEWORK_DISTRIBUTIONS,
        )
    except containers.ContainerError as exc:
        raise params.AgentError(
            f"{runtime} cannot start a container of {image} on this host ({exc}): the tasks "
            f"could not start either; run `{runtime} run --rm {image} /bin/sh -c true` as the "
            "login user and fix what it says"
        ) from None


def _remove_orphans(runtime: str, runs: Path) -> None:
    """Containers of runs with no live task on this host go before a new run is checked: a host
    that crashed lost its supervisors (which remove their containers) but not its image store,
    so the record of a container outlives them. A run with a task still live here (starting,
    running) is left alone, whichever job it belongs to."""
    ended = (protocol.STATE_EXITED, protocol.STATE_LOST)
    try:
        run_ids = containers.labelled_runs(runtime)
    except containers.ContainerError:
        return  # the check below says what is wrong with the runtime
    for run_id in run_ids:
        try:
            params.check_name(run_id, "run id")
        except params.AgentError:
            continue  # a label tfdeploy did not write
        run_dir = runs / run_id
        if run_dir.is_dir() and any(
            t.get("state") not in ended for t in procs.run_statuses(run_dir)
        ):
            continue
        # What survives `rm -f` is the runtime's to explain; the new run goes on.
        with contextlib.suppress(containers.ContainerError):
            containers.remove_run(runtime, run_id)


def _image_name(image: str) -> str:
    # A name that starts with "-" would be read as a flag by the runtime.
    if not image or image.startswith("-") or any(c.isspace() for c in image):
        raise params.AgentError(f"{image!r:.80} is not an image name")
    return image


def _runtime(preferred: str | None) -> tuple[str, dict[str, object]]:
    """The runtime and its `info`; a sentence naming the fix when it is missing or cannot run."""
    if preferred is not None and preferred not in containers.RUNTIMES:
        raise params.AgentError(f"container runtime must be podman or docker, got {preferred!r}")
    runtime = containers.find_runtime(preferred)
    if runtime is None:
        wanted = preferred or "podman or docker"
        raise params.AgentError(
            f"no container runtime: {wanted} is not installed for this user "
            f"(PATH {os.environ.get('PATH', '')}); install {preferred or 'podman'}"
        )
    try:
        return runtime, containers.runtime_info(runtime)
    except containers.ContainerError as exc:
        raise params.AgentError(
            f"{runtime} cannot run containers for this user: {exc}; run `{runtime} info` "
            "as the login user and fix what it says"
        ) from None


def gpu_runtime_problem(runtime: str, cdi_dirs: tuple[str, ...] = CDI_DIRS) -> str | None:
    """None when the runtime can give a container its GPUs, else what is missing and the fix.

    podman gives GPUs through CDI: a spec naming nvidia.com/gpu (`nvidia-ctk cdi generate`);
    docker through `--gpus`, which needs the NVIDIA container toolkit.
    """
    if containers.RUNTIMES[runtime].gpus_through == "toolkit":
        if any(shutil.which(p) for p in TOOLKIT):
            return None
        return (
            "the tasks here have GPUs but the NVIDIA container toolkit is not installed "
            "(docker's --gpus needs it): install nvidia-container-toolkit"
        )
    for directory in cdi_dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            try:
                text = Path(directory, name).read_text(errors="replace")
            except OSError:
                continue
            if "nvidia.com/gpu" in text:
                return None
    return (
        "the tasks here have GPUs but no CDI spec names nvidia.com/gpu in "
        f"{' or '.join(cdi_dirs)}: run `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
    )


def _load(req: dict[str, Any], runtime: str, image: str) -> None:
    """The layout assembled from the store (hard links, no copy), loaded, then removed."""
    index = params.param(req, "index", str)
    blobs = [params.check_hash(b) for b in params.param(req, "blobs", list)]
    try:
        json.loads(index)
    except ValueError:
        raise params.AgentError("the image's index.json is not JSON") from None
    workdir = layout.workdir_path(req)
    store = workdir / "store"
    root = layout.make_private_dir(workdir / "images")
    # Lowercase: podman 4.3 names the loaded image after this path, and a reference with an
    # uppercase letter (a run id's) is refused before the load begins.
    where = root / f"tfdeploy-load-{os.getpid()}-{int(time.time() * 1000)}"
    shutil.rmtree(where, ignore_errors=True)
    try:
        (where / "blobs" / "sha256").mkdir(parents=True)
        (where / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        (where / "index.json").write_text(index)
        for digest in blobs:
            _link(store / digest, where / "blobs" / "sha256" / digest)
        # podman 4.3 names the loaded image after the layout's path, and refuses a path that
        # is no valid reference (`.tfdeploy`: a component may not start with a dot); a link
        # of a tame name in the temporary directory stands in for it.
        tame = Path(tempfile.gettempdir()) / where.name
        tame.unlink(missing_ok=True)
        tame.symlink_to(where)
        try:
            containers.load_oci(runtime, str(tame), image)
        finally:
            tame.unlink(missing_ok=True)
    except containers.ContainerError as exc:
        raise params.AgentError(f"loading image {image} failed: {exc}") from None
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(str(src), str(dest))
    except FileNotFoundError:
        raise params.AgentError(f"the store lacks the image blob {src.name[:12]}") from None
    except OSError:
        shutil.copyfile(str(src), str(dest))
