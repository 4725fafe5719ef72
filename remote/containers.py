"""Tasks in container images on a host: the runtime, a task's `run` argv, stop, cleanup, images.

Stdlib only (the agent ships alone). Each function is one runtime command or a pure argv
builder; the agent's ops call them (docs/containers.md says what each op needs).

Why the shapes are what they are (each measured with podman 4.3 + runc; docs/containers.md):
- `--init`: a task is the container's PID 1 otherwise, and the kernel drops every signal PID 1
  has no handler for: a SIGTERM stop would do nothing until the grace ran out. The init
  (catatonit under podman, tini under docker) forwards signals and exits with the task's status.
- No `--rm`: the container is kept until the supervisor has recorded the exit, then removed by
  name (`remove`), so the exit status is never lost to a removal race.
- `podman run` in the foreground proxies SIGTERM/SIGINT to the container and exits with the
  container's status (128+N for death by signal N). SIGKILL of the client leaves the container
  running under its monitor (conmon), which is why every stop path ends with `remove_run`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Callable, Mapping, NamedTuple, Sequence


class Runtime(NamedTuple):
    """What one container runtime does its own way, in one place: everything else in this
    module is the same command for both (`run`, `stop`, `rm`, `ps`, `inspect`, `pull`, `tag`)."""

    name: str
    info_format: str  # `info --format`: "<rootless evidence> <os>/<arch>"
    rootless: Callable[[str], bool]  # from the evidence that format prints
    keep_id: bool  # rootless, it maps the login user onto itself (`--userns keep-id`)
    gpus_through: str  # "cdi" (`--device nvidia.com/gpu=I`) or "toolkit" (`--gpus device=I,J`)
    exists_argv: Callable[[str], list[str]]  # exit 0 when the image is here
    loads_oci_dir: bool  # pulls an OCI layout directory (`oci:PATH`) as it is


PODMAN = Runtime(
    name="podman",
    info_format="{{json .Host.Security.Rootless}} {{.Host.OS}}/{{.Host.Arch}}",
    rootless=lambda said: said == "true",
    keep_id=True,
    gpus_through="cdi",
    exists_argv=lambda image: ["podman", "image", "exists", image],
    loads_oci_dir=True,
)
DOCKER = Runtime(
    name="docker",
    info_format="{{json .SecurityOptions}} {{.OSType}}/{{.Architecture}}",
    rootless=lambda said: "rootless" in said,
    keep_id=False,
    gpus_through="toolkit",
    exists_argv=lambda image: ["docker", "image", "inspect", image],
    loads_oci_dir=False,  # `docker load` takes a tar stream, not a directory
)
RUNTIMES = {r.name: r for r in (PODMAN, DOCKER)}  # in the order a host's runtime is picked
LABEL_RUN = "tfdeploy.run"
LABEL_TASK = "tfdeploy.task"
TIMEOUT = 120.0  # a runtime command that hangs longer than this is a broken runtime
_LOAD_TIMEOUT = 1800.0  # a few GB of layers into a slow disk


class ContainerError(Exception):
    """A runtime command failed; the message names the command and what it said."""


def _run(argv: Sequence[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one runtime command; never raises for a failure."""
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", "{} did not answer within {:.0f} s".format(" ".join(argv[:2]), timeout)
    out = done.stdout.decode("utf-8", "replace")
    return done.returncode, out, done.stderr.decode("utf-8", "replace")


def _checked(argv: Sequence[str], timeout: float = TIMEOUT) -> str:
    code, out, err = _run(argv, timeout)
    if code != 0:
        said = (err.strip() or out.strip() or "no output").splitlines()[-1]
        raise ContainerError("`{}` failed (exit {}): {}".format(" ".join(argv), code, said))
    return out


# -- the runtime ---------------------------------------------------------------------------------


def find_runtime(preferred: str | None = None) -> str | None:
    """The runtime's program name: `preferred` if installed, else podman, else docker; None."""
    names = (preferred,) if preferred else tuple(RUNTIMES)
    for name in names:
        if name in RUNTIMES and shutil.which(name):
            return name
    return None


def runtime_info(runtime: str) -> dict[str, object]:
    """What preflight needs of a runtime, from its own `info`: usable by this user at all,
    rootless or not (that decides how mounts get the login user's ownership), the host's
    platform. Raises ContainerError with the runtime's own words when it cannot run."""
    described = RUNTIMES[runtime]
    out = _checked([runtime, "info", "--format", described.info_format]).strip()
    first, _, platform = out.rpartition(" ")
    rootless = described.rootless(first)
    return {"runtime": runtime, "rootless": rootless, "platform": normalize_platform(platform)}


def normalize_platform(platform: str) -> str:
    """`linux/amd64`; docker's `info` says x86_64/aarch64 where images say amd64/arm64."""
    aliases = {"x86_64": "amd64", "aarch64": "arm64"}
    os_name, _, arch = platform.strip().partition("/")
    return f"{os_name.lower()}/{aliases.get(arch, arch)}"


# -- names and the run argv ----------------------------------------------------------------------


def container_name(run_id: str, task: str) -> str:
    """`tfdeploy-<run>-<task>`: one container per task of a run; runtimes allow [a-zA-Z0-9_.-]."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in f"{run_id}-{task}")
    return "tfdeploy-" + safe


def gpu_flags(runtime: str, gpus: Sequence[int]) -> list[str]:
    """The flags that give a container exactly the host GPUs `gpus` (host indices).

    podman: CDI, one `--device nvidia.com/gpu=I` per GPU (needs `nvidia-ctk cdi generate`).
    docker: `--gpus "device=I,J"` (needs the NVIDIA container toolkit). Inside, the GPUs are
    numbered 0..n-1 in this order; `task_env` sets CUDA_VISIBLE_DEVICES to match.
    """
    if not gpus:
        return []
    if RUNTIMES[runtime].gpus_through == "toolkit":
        return ["--gpus", '"device={}"'.format(",".join(str(i) for i in gpus))]
    flags: list[str] = []
    for index in gpus:
        flags += ["--device", f"nvidia.com/gpu={index}"]
    return flags


def task_env(env: dict[str, str], gpus: Sequence[int] | None) -> dict[str, str]:
    """The task's environment as the container sees it.

    The plan masks GPUs with CUDA_VISIBLE_DEVICES holding host indices; a container given only
    those GPUs sees them as 0..n-1, so the host indices would name GPUs that are not there.
    With `gpus` given (GPU flags in use), the variable becomes 0..n-1; without, it is kept.
    """
    out = dict(env)
    if gpus:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    return out


def client_env(
    base: Mapping[str, str], env: Mapping[str, str], gpus: Sequence[int] = ()
) -> dict[str, str]:
    """The environment the runtime's client runs with: `base` (the host's, for the runtime
    itself) and the task's variables, which `run_argv` passes into the container by name."""
    return {**base, **task_env(dict(env), gpus)}


def run_argv(
    runtime: str,
    *,
    image: str,
    run_id: str,
    task: str,
    command: str,
    env: dict[str, str],
    mounts: Sequence[str],
    cwd: str,
    uid: int,
    gid: int,
    rootless: bool = False,
    gpus: Sequence[int] = (),
) -> list[str]:
    """`RUNTIME run ...` for one task: run it in the foreground, its output on our stdout. The
    client must run with `client_env(...)` of the same `env` and `gpus`.

    `mounts` are host paths (the run's code directory, the workdir) mounted at the same paths,
    so every path in the task's spec and environment holds inside as outside. Files written
    there belong to the login user: a rootful runtime runs the task as `--user uid:gid`; rootless
    podman maps the login user onto itself with `--userns keep-id` (a `--user` there would be a
    subordinate uid outside). The host's network: TF ports as planned, the network check holds.
    """
    argv = [runtime, "run", "--init", "--name", container_name(run_id, task)]
    argv += ["--label", f"{LABEL_RUN}={run_id}"]
    argv += ["--label", f"{LABEL_TASK}={task}"]
    argv += ["--network", "host", "--workdir", cwd]
    if rootless and RUNTIMES[runtime].keep_id:
        argv += ["--userns", "keep-id"]
    else:
        argv += ["--user", f"{uid}:{gid}"]
    for path in mounts:
        # "PATH:ro" mounts read-only (a host's toolchain or data set the task must not change).
        bare, read_only = (path[:-3], True) if path.endswith(":ro") else (path, False)
        argv += ["--volume", f"{bare}:{bare}" + (":ro" if read_only else "")]
    # Names only: the runtime takes each value from its own environment (client_env), so no
    # value (TF_CONFIG, a secret_env token) stands in the client's command line, which every
    # user of the host can read in /proc.
    for key in sorted(task_env(env, gpus)):
        argv += ["--env", key]
    argv += gpu_flags(runtime, gpus)
    argv += [image, "/bin/sh", "-c", command]
    return argv


# The trial's command: the image's Python (the tasks', else python3, else python) says its
# TensorFlow and its FRAMEWORKS (set before this text: `trial`), read from package metadata
# (importing them costs seconds); an image without Python says "tensorflow -" all the same. The
# image's Python may be any, 3.6 too: without importlib.metadata (3.7 and older) it says
# "frameworks ?", not read, which is not the same as none installed ("frameworks read").
_TF_PROBE = (
    "try:\n"
    "    from importlib import metadata\n"
    "except ImportError:\n"
    "    metadata = None\n"
    "found = '-'\n"
    "for d in ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu', 'tf-nightly'):\n"
    "    try:\n"
    "        found = metadata.version(d)\n"
    "        break\n"
    "    except Exception:\n"
    "        pass\n"
    "print('tensorflow', found)\n"
    "for d in FRAMEWORKS if metadata is not None else ():\n"
    "    try:\n"
    "        print('framework', d, metadata.version(d))\n"
    "    except Exception:\n"
    "        pass\n"
    "print('frameworks', '?' if metadata is None else 'read')\n"
)
_TRIAL_SH = (
    'probe="$1"; shift; for p in "$@" python3 python; do '
    'if command -v "$p" >/dev/null 2>&1; then '
    '"$p" -I -c "$probe" || echo "tensorflow ?"; exit 0; fi; done; echo "tensorflow -"'
)
# What of the trial's output is read: the probe's lines are its last, a few short ones; whatever
# else an image prints (its Python is the image's, so any text at all) is not looked at.
_TRIAL_TAIL = 4096
# A version as a dist-info's METADATA says it (PEP 440: "2.13.0+cpu", "1!0.4.dev3").
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]{0,63}")


class Trial(NamedTuple):
    """What a trial container's Python read of the image."""

    tensorflow: str | None  # None: none, or no Python in the image
    frameworks: dict[str, str] | None  # those asked for that it has; None: not read


def trial(
    runtime: str,
    image: str,
    *,
    run_id: str,
    mounts: Sequence[str],
    rootless: bool,
    pythons: Sequence[str] = (),
    frameworks: Sequence[str] = (),
) -> Trial:
    """One throwaway container of `image`, made as a task's is (init, host network, user,
    mounts, /bin/sh), run to its end and removed: what a task's start needs of this host's
    runtime (cgroups, namespaces, the init, the mounts), proved before anything starts. Returns
    the image's TensorFlow version and which of the `frameworks` distributions it has, as the
    first of `pythons` (the tasks' first words), else python3, else python, finds them; raises
    ContainerError with the runtime's words when the container cannot run."""
    name = container_name(run_id, "preflight-trial")
    argv = run_argv(
        runtime,
        image=image,
        run_id=run_id,
        task="preflight-trial",
        command=_TRIAL_SH,
        env={},
        mounts=mounts,
        cwd="/",
        uid=os.getuid(),
        gid=os.getgid(),
        rootless=rootless,
    )
    argv[1:2] = ["run", "--rm"]
    argv += ["sh", f"FRAMEWORKS = {tuple(frameworks)!r}\n" + _TF_PROBE, *pythons]
    try:
        code, out, err = _run(argv)
    finally:
        _run([runtime, "rm", "-f", name])  # a container the runtime created and could not start
    if code != 0:
        said = (err.strip() or out.strip() or "no output").splitlines()[-1]
        raise ContainerError(f"exit {code}: {said}")
    return parse_trial(out, frameworks)


def parse_trial(out: str, frameworks: Sequence[str]) -> Trial:
    """The trial's output as values, read strictly: its last _TRIAL_TAIL characters only, a
    framework only of those asked for and with a version's shape, none at all unless the probe
    said it read them."""
    words = [line.split() for line in out[-_TRIAL_TAIL:].splitlines()]
    said = [w for w in words if w[:1] == ["tensorflow"]]
    version = said[-1][1] if said and len(said[-1]) == 2 else "-"
    tensorflow = None if version in ("-", "?") else version
    if ["frameworks", "read"] not in words:
        return Trial(tensorflow, None)
    found: dict[str, str] = {}
    for w in words:
        if len(w) == 3 and w[0] == "framework" and w[1] in frameworks and _VERSION.fullmatch(w[2]):
            found.setdefault(w[1], w[2])
    return Trial(tensorflow, found)


def returncode(status: int) -> int:
    """The task's status from the runtime client's: 128+N (N a signal, 1..64) is death by N,
    as Popen says it (-N), so exit.json records a signal as for a task outside a container.

    A task that itself exits 128+N is recorded as killed by N: the runtime reports both alike.
    125-127 are the runtime's own failures (cannot create, cannot exec, not found).
    """
    if 128 < status <= 128 + 64:
        return -(status - 128)
    return status


# -- stop and cleanup ----------------------------------------------------------------------------


def stop(runtime: str, name: str, grace: float) -> None:
    """SIGTERM to the task (through the container's init), SIGKILL after `grace` seconds, then
    remove the container. Quiet for a container that is already gone."""
    _run([runtime, "stop", "-t", str(max(0, round(grace))), name], TIMEOUT + grace)
    remove(runtime, name)


def remove(runtime: str, name: str) -> bool:
    """Force-remove one container (killing it if it runs); False when there was none."""
    code, _, _ = _run([runtime, "rm", "-f", name])
    return code == 0


def run_containers(runtime: str, run_id: str) -> list[str]:
    """IDs of every container of the run on this host, running or not, found by its label."""
    out = _checked([runtime, "ps", "-a", "-q", "--filter", f"label={LABEL_RUN}={run_id}"])
    return out.split()


def labelled_runs(runtime: str) -> list[str]:
    """The run id of every container of a tfdeploy run on this host, running or not."""
    found = _checked([runtime, "ps", "-a", "-q", "--filter", f"label={LABEL_RUN}"]).split()
    if not found:
        return []
    template = "{{index .Config.Labels " + json.dumps(LABEL_RUN) + "}}"
    out = _checked([runtime, "inspect", "--format", template, *found])
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def remove_run(runtime: str, run_id: str) -> list[str]:
    """Force-remove every container of the run: the last step of every stop path (`down`, a
    lease that expired, a supervisor that died), since killing a task's process group ends only
    the runtime's client, not the container its monitor keeps. Returns the IDs it removed."""
    found = run_containers(runtime, run_id)
    if found:
        _run([runtime, "rm", "-f", *found])
    left = run_containers(runtime, run_id)
    if left:
        raise ContainerError(
            "{} container(s) of run {} survive `{} rm -f`: {}".format(
                len(left), run_id, runtime, " ".join(left)
            )
        )
    return found


# -- images --------------------------------------------------------------------------------------


def image_exists(runtime: str, image: str) -> bool:
    return _run(RUNTIMES[runtime].exists_argv(image))[0] == 0


def image_platform(runtime: str, image: str) -> str:
    """`os/arch` of a local image, as `runtime_info`'s platform is written."""
    out = _checked([runtime, "image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", image])
    return normalize_platform(out.strip().splitlines()[0])


def pull(runtime: str, image: str) -> None:
    """Pull through the host's own registry access (the default source of an image)."""
    _checked([runtime, "pull", "-q", image], _LOAD_TIMEOUT)


def load_oci(runtime: str, layout_dir: str, image: str) -> str:
    """Load the image from an OCI layout directory (as the controller saved it) and tag it
    `image`; returns its ID. podman 4.3 names an image loaded from a directory after the
    directory's path (it ignores the layout's ref.name), so the ID is tagged and that
    path-made name dropped. docker's `load` takes a tar stream, not a directory: podman only."""
    if not RUNTIMES[runtime].loads_oci_dir:
        raise ContainerError("loading an OCI layout directory needs podman, not " + runtime)
    out = _checked([runtime, "pull", "-q", "oci:" + os.path.abspath(layout_dir)], _LOAD_TIMEOUT)
    image_id = out.strip().splitlines()[-1]
    _checked([runtime, "tag", image_id, image])
    tags = json.loads(
        _checked([runtime, "image", "inspect", "--format", "{{json .RepoTags}}", image_id])
    )
    for tag in tags or []:
        if tag != image and not tag.endswith("/" + image):
            _run([runtime, "untag", image_id, tag])
    return image_id
