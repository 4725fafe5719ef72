"""The wire shapes: each op's request and reply as TypedDicts, defined once (PROTOCOL.md).

protocol.py names every shape too (`protocol.HelloReply`), so both sides keep importing one
module; the shapes live here to keep each module one concept: protocol.py holds the words
(ops, states, reasons, codes), this module the shapes of the messages that carry them.
Stdlib only, like every module of remote/; annotations stay strings on the host.
"""

from __future__ import annotations

from typing import Any, TypedDict

#
# A request is {"v", "op", "workdir", ...its op's fields}; a reply {"v", "ok", ...its op's fields}
# (ok: false carries "error" instead). The shapes below hold the op's own fields. The agent
# annotates what it answers with them; the control side checks every reply against them at its
# one edge (deployer/hosts/replies.py `Edge.reply`: a missing or wrong-typed field is a protocol
# error naming the op and the field) and builds its requests as them, so mypy catches a key typo.
# Python 3.8 has no NotRequired: a shape with optional keys is a required base and a
# `total=False` subclass. Annotations stay strings on the host (never evaluated there).


class FailureBody(TypedDict):
    """Every failure reply of every op (ok: false)."""

    error: str  # the host's words for a person: cleaned before they reach a terminal
    code: str  # one of FAIL_CODES


class FailureReply(FailureBody, total=False):
    subject: str  # with FAIL_DAMAGED: the sha256 of the content that arrived damaged


class Envelope(TypedDict):
    """What every request carries around its op's fields."""

    v: int
    op: str
    workdir: str


class Listen(TypedDict):
    ports: list[int]
    seconds: float


class InterpretersQuery(TypedDict):
    python: str  # the interpreter preflight checked, as configured
    words: list[str]  # the first words of the tasks' commands that name a Python


class InterpretersShape(TypedDict):
    """Each interpreter as [real path, venv or ""] (interpreters.identity), null: not found."""

    checked: list[str] | None
    found: dict[str, list[str] | None]


class HelloRequest(TypedDict, total=False):
    interpreters: InterpretersQuery
    ports: list[int]
    run_id: str
    lease_seconds: float | None
    job: str  # the run's job, kept with its reservation (`down INVENTORY` finds it by it)
    runs: bool
    hosts_of: str
    listen: Listen
    resume: bool  # `up --resume`: the run's folder is there, ended; its stop is lifted


class UsageShape(TypedDict):
    """A running task's resources (remote/taskmetrics.py): CPU percent, RSS bytes, processes."""

    cpu: float
    rss: int
    procs: int


class TaskStatusFields(TypedDict):
    """One task of a start, poll, stop or runs reply (PROTOCOL.md "A task status")."""

    name: str
    state: str  # one of TASK_STATES
    pid: int | None
    pgid: int | None
    started: float | None
    ended: float | None
    exit_code: int | None
    signal: int | None
    reason: str | None  # one of EXIT_REASONS, once exited
    notice: dict[str, Any] | None
    disk_full: str | None
    log_bytes: int
    restarts: int
    frozen: bool


class TaskStatusShape(TaskStatusFields, total=False):
    usage: UsageShape  # poll and runs replies, running tasks
    last: list[str]  # runs replies: the task's newest metrics lines, as the task wrote them


class RunBase(TypedDict):
    run_id: str
    job: str | None
    created: float
    detached: bool | None
    hosts: list[list[str]] | None
    hosts_at: float | None
    tasks: list[TaskStatusShape]


class RecoveryShape(TypedDict):
    """One restart by a run's keeper (remote/keeper.py `recoveries`)."""

    attempt: int  # the attempt it started (TFDEPLOY_ATTEMPT); a task restart: the current one
    task: str | None  # the task restarted alone (policy "restart"); None: the whole job
    cause: str  # "worker:1 was killed by signal 9"
    backoff: float | None
    started_after_s: float | None  # failure seen -> every restarted task running again
    stepping_after_s: float | None  # failure seen -> the first new step record


class RunShape(RunBase, total=False):
    """One run of a runs reply (and of a hello with `runs`)."""

    # No task yet, and its `up` is preparing it (pushing, installing, setting up, starting):
    # a run for `down`, `status` and `prune` from its preflight's reservation on.
    starting: bool
    # Its keeper or warden lives on this host (remote/warden.py): the run is not over while
    # they are, even with every task exited (a restart's backoff).
    kept: bool
    # Not detached, not stopped, and its `up`'s lease is live here: an `up` holds the run (and
    # its policy, unless it is kept); `attach` tells a restart under way from a run left alone.
    leased: bool
    # The keeper's restarts of the run, on the keeper's host: how many in all, and the newest
    # of them, newest last (at most 20).
    restarts: int
    recoveries: list[RecoveryShape]
    # On the keeper's host, once its guard stopped the run (remote/guards.py): why, in words.
    guard_stop: str


class _Recovered(TypedDict):
    restarts: int
    recoveries: list[RecoveryShape]


class RecoveredShape(_Recovered, total=False):
    """A run's keeper's restarts as a runs reply carries them (remote/agent.py), and why its
    guard stopped the run, where one did."""

    guard_stop: str


class HelloFacts(TypedDict):
    hostname: str
    python: str  # the full version of the interpreter the hello runs as ("3.11.7")
    machine: str  # platform.machine(): x86_64, aarch64
    glibc: str | None  # "2.36"; null without glibc (musl)
    tensorflow: str | None
    workdir: str
    disk_free: int
    store_empty: bool
    busy_ports: list[int]
    reserved_by: dict[str, str]
    agent_id: str
    host_id: str
    shared_with: list[str]


class HelloReply(HelloFacts, total=False):
    reserved_state: dict[str, str]  # per port of reserved_by: "running" or "starting"
    executable: str  # the real path of the interpreter the hello runs as
    prefix: str  # its sys.prefix (a venv's, for a venv's python)
    # The frameworks beside TensorFlow the hello's python has, from their dist-info:
    # {"torch": "2.13.0+cpu", "jax": "0.10.2", "jaxlib": "0.10.2", "keras": "3.15.1"}
    frameworks: dict[str, str]
    runs: list[RunShape]  # asked with `runs`
    nvidia_smi: bool  # asked with `runs`: the host has nvidia-smi (GPU use can be read)
    listening: int  # the stand-ins' pid, when `listen` was asked and no port was busy
    interpreters: InterpretersShape  # asked with `interpreters`
    attempt: int  # asked with `resume`: the run's last TFDEPLOY_ATTEMPT here


class AbsentReply(TypedDict):
    """The bootstrap's hello with `look_only` on a host without the workdir."""

    absent: bool
    workdir: str


class HaveRequest(TypedDict):
    hashes: list[str]


class HaveReply(TypedDict):
    missing: list[str]


class MaterializeBase(TypedDict):
    run_id: str
    job: str
    files: list[list[Any]]  # [relpath, sha256, mode]


class MaterializeRequest(MaterializeBase, total=False):
    detached: bool
    lease_seconds: float | None
    controller: str | None  # who started the run (user@machine)
    hosts: list[list[str]]
    hosts_at: float
    blobs: list[list[Any]]  # [sha256, size, mode?]
    or_missing: bool
    keep: list[str]  # contents the store must hold too, placed nowhere (the job's wheels)


class MaterializeReply(TypedDict, total=False):
    files: int  # placed
    missing: list[str]  # with or_missing: the store lacks these, nothing was placed


class SetupBase(TypedDict):
    run_id: str
    commands: list[str]
    env: dict[str, str]
    fingerprint: str


class SetupRequest(SetupBase, total=False):
    venv: str  # the commands run inside this venv (activated), else
    python: str  # with this interpreter's directory first on PATH


class SetupReply(TypedDict):
    ran: bool
    code: int
    tail: list[str]


class ContainerShape(TypedDict):
    """A start request's task item `container`: the task runs in this image (docs/containers.md)."""

    image: str
    runtime: str  # "podman" or "docker", as the image op found it
    rootless: bool  # the runtime runs rootless for the login user (mounts: --userns keep-id)
    mounts: list[str]  # host paths mounted at the same path: workdir, job's container_mounts
    gpus: list[int]  # host GPU indices the plan gives the task


class SpotShape(TypedDict):
    """A start request's task item `spot`: where its supervisor polls for an interruption
    notice, how often, and how long before the machine goes it sends SIGKILL."""

    url: str
    interval: float
    margin: float


class StartTaskBase(TypedDict):
    name: str
    command: str
    env: dict[str, str]


class StartTask(StartTaskBase, total=False):
    """One task of a start request. What it runs in: `venv` (the job's environment, activated)
    or `python` (the host python, its directory first on PATH), and `container` (the image's
    own Python, in that image) beside them."""

    cwd: str
    cpus: str  # a CPU list ("0-3,8"): the supervisor pins the task before exec
    # [job] checkpoint_dir: relative, the job's own folder on this host; absolute or ~ as is.
    # The agent makes it (0700) and names it in TFDEPLOY_CHECKPOINT_DIR.
    checkpoint_dir: str
    spot: SpotShape
    venv: str
    python: str
    container: ContainerShape


class StartBase(TypedDict):
    run_id: str
    tasks: list[StartTask]
    grace: float


class StartRequest(StartBase, total=False):
    release: bool
    resumed: bool  # `up --resume`: each task's log says where the resumed attempt begins


class TasksReply(TypedDict):
    tasks: list[TaskStatusShape]


class LogShape(TypedDict):
    task: str
    offset: int
    bytes: int


class PollBase(TypedDict):
    run_id: str
    offsets: dict[str, int]


class PollRequest(PollBase, total=False):
    max_bytes: int
    ports: list[int]
    heartbeat: bool
    metrics: dict[str, int]  # task -> byte offset in its metrics file: new lines are sent


class MetricLinesShape(TypedDict):
    task: str
    offset: int  # after the lines
    lines: list[str]


class PollBody(TypedDict):
    tasks: list[TaskStatusShape]
    logs: list[LogShape]
    listening: list[int]


class PollReply(PollBody, total=False):
    raw: int  # the log bytes after the reply line, in `logs` order; absent: none
    metrics: list[MetricLinesShape]  # when the request had `metrics`


class StopBase(TypedDict):
    run_id: str
    grace: float


class StopRequest(StopBase, total=False):
    tasks: list[str] | None  # None: the whole run
    escaped: bool


class EscapedShape(TypedDict):
    pid: int
    cmd: str
    signal: int | None


class StopReply(TasksReply, total=False):
    escaped: list[EscapedShape]  # a whole-run stop, or one with `escaped`


class RunsRequest(TypedDict, total=False):
    hosts_of: str


class RunsReply(TypedDict):
    runs: list[RunShape]


class RunRequest(TypedDict):
    run_id: str


class ReleaseReply(TypedDict):
    released: int


class DetachReply(TypedDict):
    detached: bool
