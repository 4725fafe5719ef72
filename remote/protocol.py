"""What the control side and the host agent must agree on, defined once (docs/PROTOCOL.md).

Both sides import this file: the agent as a top-level module next to it on the host, the
control side as `remote.protocol`. So it stays stdlib-only and runs on Python 3.8.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Final, TypedDict, Union

# Every request and reply carries it as "v"; the agent answers another version with ok: false.
PROTOCOL_VERSION: Final = 1

# The ops: a request's "op" (PROTOCOL.md "Operations").
OP_HELLO: Final = "hello"
OP_HAVE: Final = "have"
OP_MATERIALIZE: Final = "materialize"
OP_SETUP: Final = "setup"
OP_START: Final = "start"
OP_POLL: Final = "poll"
OP_STOP: Final = "stop"
OP_RUNS: Final = "runs"
OP_RELEASE: Final = "release"
OP_DETACH: Final = "detach"
OP_GPUS: Final = "gpus"
OP_FIREWALL: Final = "firewall"
OP_NETCHECK: Final = "netcheck"
OP_COLLECT: Final = "collect"
OP_FETCH: Final = "fetch"
OP_IDLE: Final = "idle"
OP_PEERS: Final = "peers"
OP_PRUNE: Final = "prune"
OP_ENVIRONMENT: Final = "env"
OP_IMAGE: Final = "image"
OP_ENV_PROGRESS: Final = "envprogress"
OPS: Final = (
    OP_HELLO,
    OP_HAVE,
    OP_MATERIALIZE,
    OP_SETUP,
    OP_START,
    OP_POLL,
    OP_STOP,
    OP_RUNS,
    OP_RELEASE,
    OP_DETACH,
    OP_GPUS,
    OP_FIREWALL,
    OP_NETCHECK,
    OP_COLLECT,
    OP_FETCH,
    OP_IDLE,
    OP_PEERS,
    OP_PRUNE,
    OP_ENVIRONMENT,
    OP_IMAGE,
    OP_ENV_PROGRESS,
)

# The "action" of the ops that have several: firewall, netcheck, peers.
FIREWALL_CHECK: Final = "check"
FIREWALL_ADD: Final = "add"
FIREWALL_REMOVE: Final = "remove"
FIREWALL_LIST: Final = "list"
NETCHECK_LISTEN: Final = "listen"
NETCHECK_PROBE: Final = "probe"
NETCHECK_CLOSE: Final = "close"
PEERS_RELAY: Final = "relay"
PEERS_SEED: Final = "seed"
PEERS_CLOSE: Final = "close"
IMAGE_CHECK: Final = "check"
IMAGE_LOAD: Final = "load"

# The verdict of one netcheck probe, one per target; an unresolved name is "unresolved: <why>".
PROBE_OK: Final = "ok"
PROBE_REFUSED: Final = "refused"
PROBE_TIMED_OUT: Final = "timed out"
PROBE_NO_ROUTE: Final = "no route"
PROBE_UNRESOLVED: Final = "unresolved"
# A host probes with this many connects in flight at most (a pool, not a thread per target): a
# host of a 1,000-host job neither starts 999 threads nor sends 999 SYNs in one burst.
PROBE_WORKERS: Final = 16


def probe_budget(targets: int, wait: float) -> float:
    """The longest a probe op of `targets` connects may take: every connect times out (`wait`
    each, PROBE_WORKERS at a time) and is tried once more. The caller's deadline and the stand-in
    listeners' life must cover the whole queue, not one connect, or a slow host reads as blocked."""
    rounds = -(-targets // PROBE_WORKERS)
    return 2 * rounds * wait


# Task states: a task status's "state" (PROTOCOL.md "Task states"). Finished: exited or lost.
STATE_STARTING: Final = "starting"  # spec written, no pid.json yet
STATE_RUNNING: Final = "running"
STATE_EXITED: Final = "exited"  # exit.json written: its reason says how it ended
STATE_LOST: Final = "lost"  # supervisor and task gone without an exit.json: nobody recorded it
TASK_STATES: Final = (STATE_STARTING, STATE_RUNNING, STATE_EXITED, STATE_LOST)

# Why a task ended: exit.json's "reason", a task status's "reason" (null until it exited).
REASON_EXITED: Final = "exited"  # by itself: "code" set
REASON_SIGNAL: Final = "signal"  # killed by "signal", not by tfdeploy
REASON_STOPPED: Final = "stopped"  # a stop op, or SIGTERM to its supervisor
REASON_LEASE_EXPIRED: Final = "lease expired"  # no heartbeat from the controller in time
REASON_PREEMPTED: Final = "preempted"  # a spot interruption notice
EXIT_REASONS: Final = (
    REASON_EXITED,
    REASON_SIGNAL,
    REASON_STOPPED,
    REASON_LEASE_EXPIRED,
    REASON_PREEMPTED,
)

# What a failure reply (ok: false) is about: its "code", beside the "error" sentence a person
# reads. The control side matches the code, never the sentence, so the words stay free to improve.
FAIL_REFUSED: Final = "refused"  # every failure without a code of its own below
FAIL_RUN_STOPPED: Final = "run stopped"  # `down` stopped the run: nothing of it starts again
FAIL_NO_RUN: Final = "no run"  # this host holds no such run
FAIL_DAMAGED: Final = "damaged"  # a content arrived damaged or short: "subject" is its sha256
FAIL_CODES: Final = (FAIL_REFUSED, FAIL_RUN_STOPPED, FAIL_NO_RUN, FAIL_DAMAGED)

# `agent.py serve` ends a session after this long without a request, with this exit status
# (EX_TEMPFAIL): "left while idle; the request sent as it left was never read, send it again".
# The bootstrap's answer when this agent version is not installed on the host: the control side
# then sends the agent's files as one more line. Files travel only to hosts that lack them.
BOOTSTRAP_NEEDS_FILES: Final = "needs_files"

SERVE_IDLE_S: Final = 15.0
SERVE_IDLE_EXIT: Final = 75
# Set in the agent's environment, replaces SERVE_IDLE_S (tests).
SERVE_IDLE_ENV: Final = "TFDEPLOY_SERVE_IDLE_S"

# Set in every task's environment by the control side; a whole-run stop also ends the processes
# that left their task's process group by finding this exact value in their environment.
RUN_ID_ENV: Final = "TFDEPLOY_RUN_ID"
# The task's name (role:index), set by the control side in the task's environment.
TASK_ENV: Final = "TFDEPLOY_TASK"
# The whole job's attempt (0 first; on_failure = "restart-job" starts every task again with n+1).
ATTEMPT_ENV: Final = "TFDEPLOY_ATTEMPT"

# The host identity (hostid.py). Set by the supervisor in every task's environment, so a stop on
# one host never takes another host's processes for its own; set in the agent's environment, it
# replaces the computed identity (tests simulate several hosts sharing one workdir with it).
HOST_ID_ENV: Final = "TFDEPLOY_HOST_ID"
# Every name above that tfdeploy sets in a task's environment, over what the inventory's env says:
# an inventory that sets one is refused (deployer/config/plan.py), never silently overwritten.
# The path of the task's metrics file (JSON lines: step, total_steps, loss, ...), set by the
# supervisor; remote/tfdeploy_metrics.py writes it, the poll and runs ops read it.
METRICS_ENV: Final = "TFDEPLOY_METRICS"
TASK_ENV_NAMES: Final = (RUN_ID_ENV, TASK_ENV, ATTEMPT_ENV, HOST_ID_ENV, METRICS_ENV)

# An op's result may carry, under this key, a function that writes raw bytes to the agent's
# stdout after the reply line; the reply's "raw" field says how many (never sent as JSON).
RAW_BODY: Final = "_raw_body"
# A hashed fetch's raw bytes end with the whole file's sha256 (64 hex digits) and b"1" when the
# file stood still while it was read (b"0": it changed); "raw" counts these 65 bytes too.
FETCH_TRAILER: Final = 65

# The TF task types listed in the cluster dict: the ones the built-in server may serve
# (tfserver.py); the control side's roles table (deployer/config/roles.py) must agree.
CLUSTER_ROLES: Final = ("chief", "worker", "ps")

# How long a port reservation taken at hello lives without a heartbeat of its run.
DEFAULT_RESERVATION_S: Final = 60.0

# prune leaves alone what changed this recently: a content stored or linked, an environment
# used or built, a run directory half-written (each may be on its way into a run just starting).
PRUNE_GRACE_S: Final = 3600.0


def is_pushed(name: str) -> bool:
    """Every remote/*.py is pushed to hosts, except the package marker the control side needs."""
    return name.endswith(".py") and name != "__init__.py"


def agent_id(files: Iterable[tuple[str, bytes]]) -> str:
    """Content id of the agent's files: two tfdeploy versions never overwrite each other's agent.

    Fed (name, content) pairs of the pushed files; the order is fixed here, not by the caller.
    """
    digest = hashlib.sha256()
    for name, content in sorted(files):
        if is_pushed(name):
            digest.update(name.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:12]


# ---- The wire shapes: each op's request and reply, defined once -------------------------------
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


class RunShape(RunBase, total=False):
    """One run of a runs reply (and of a hello with `runs`)."""

    # No task yet, and its `up` is preparing it (pushing, installing, setting up, starting):
    # a run for `down`, `status` and `prune` from its preflight's reservation on.
    starting: bool


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
    listening: int  # the stand-ins' pid, when `listen` was asked and no port was busy
    interpreters: InterpretersShape  # asked with `interpreters`


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


class GpusRequest(TypedDict, total=False):
    run_id: str  # mark the compute processes of this run (`run` of each app)


class GpuShape(TypedDict):
    index: int
    uuid: str
    name: str
    memory_total: float | None
    memory_used: float | None
    utilization: float | None
    pci_bus_id: str
    driver_version: str
    # nvidia-smi's own words for the health fields it knows (GPU_HEALTH_FIELDS; a driver that
    # lacks one leaves it out), e.g. {"retired_pages.pending": "No"}
    health: dict[str, str]
    problem: str | None  # a value such as "[GPU requires reset]" in the GPU's row


class GpuAppShape(TypedDict):
    gpu_uuid: str
    pid: float | None
    process_name: str
    used_memory: float | None
    run: bool | None  # of the request's run (its environment says so); null: cannot tell
    task: str | None  # the process's TFDEPLOY_TASK when it is of the request's run, else null


class GpuLostShape(TypedDict):
    pci_bus_id: str
    reason: str


class GpusReply(TypedDict):
    nvidia_smi: str | None
    error: str | None
    gpus: list[GpuShape]
    apps: list[GpuAppShape]
    lost: list[GpuLostShape]  # GPUs nvidia-smi cannot reach (fallen off the bus)


# The health fields the `gpus` op asks nvidia-smi for (`nvidia-smi --help-query-gpu`).
GPU_HEALTH_FIELDS: Final = (
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "mig.mode.current",
)


class FirewallBase(TypedDict):
    action: str  # FIREWALL_*


class FirewallRequest(FirewallBase, total=False):
    run_id: str
    ports: list[int]
    allowed: list[str]
    backend: str


class FirewallCheckReply(TypedDict):
    backend: str | None
    problem: str | None


class FirewallRulesReply(TypedDict):
    backend: str | None
    rules: list[str]


class FirewallListReply(TypedDict):
    rules: list[str]


class FirewallRemoveReply(TypedDict):
    removed: int


class NetcheckBase(TypedDict):
    action: str  # NETCHECK_*
    run_id: str


class NetcheckRequest(NetcheckBase, total=False):
    ports: list[int]  # listen
    seconds: float  # listen
    targets: list[list[Any]]  # probe: [address, port]
    wait: float  # probe: each connect's timeout


class ListenReply(TypedDict):
    pid: int


class ProbeReply(TypedDict):
    results: list[str]  # one PROBE_* verdict per target ("unresolved: <why>" too)


class ClosedReply(TypedDict):
    closed: bool


class CollectBase(TypedDict):
    run_id: str
    patterns: list[str]


class CollectRequest(CollectBase, total=False):
    tasks: list[str] | None
    hash: bool
    hash_only: dict[str, list[str]]


class CollectedBase(TypedDict):
    files: list[list[Any]]  # [path, size, mode, sha256 or null]
    refused: list[str]


class CollectedShape(CollectedBase, total=False):
    unread: int  # of `refused`, files and folders there that could not be read (PATH_MAX...)


class CollectReply(TypedDict):
    tasks: dict[str, CollectedShape]


class FetchBase(TypedDict):
    run_id: str
    task: str
    path: str
    patterns: list[str]


class FetchRequest(FetchBase, total=False):
    offset: int
    length: int
    hash: bool


class FetchReply(TypedDict):
    size: int
    raw: int  # the bytes after the reply line (with `hash`, FETCH_TRAILER of them too)


class IdleBase(TypedDict):
    minutes: float


class IdleRequest(IdleBase, total=False):
    command: str
    interval: float


class IdleReply(TypedDict):
    armed: bool
    pid: int | None
    minutes: float


class PeersBase(TypedDict):
    action: str  # PEERS_*
    run_id: str


class PeersRequest(PeersBase, total=False):
    address: str  # relay
    port: int  # relay
    secret: str  # relay, seed
    next: list[Any] | None  # relay, seed: [address, port], or None (the last relay)
    seconds: float  # relay
    blobs: list[list[Any]]  # seed
    store: list[str]  # relay, seed: the contents this host keeps (absent: all); others pass on


class PeersPidReply(TypedDict):
    pid: int


class ChainEntryBase(TypedDict):
    error: str  # "" when that host stored everything


class ChainEntry(ChainEntryBase, total=False):
    host: str  # the host id of a host the stream reached
    hop: list[Any]  # [address, port] of the next host, when the stream never reached it


class ChainReply(TypedDict):
    chain: list[ChainEntry]


class PruneBase(TypedDict):
    keep: int  # the newest runs of each job kept on each host


class PruneRequest(PruneBase, total=False):
    older_than: float | None  # only runs created before this time (Unix seconds)
    dry_run: bool  # say what would go, remove nothing
    grace: float  # seconds; PRUNE_GRACE_S when absent


class PruneReply(TypedDict):
    runs: list[str]  # run ids removed from this host (dry_run: that would be)
    running: list[str]  # runs the rules chose, kept because they may still run
    contents: int  # store contents removed
    environments: list[str]  # environment hashes removed
    bytes: int  # freed, each inode counted once
    dry_run: bool


class EnvBase(TypedDict):
    run_id: str
    hash: str  # the environment hash: WORKDIR/envs/<hash>/ is its venv
    python: str  # the base interpreter the venv is built on
    requirements: str  # what is installed: the pinned list (pip's requirements-file syntax)
    wheels: list[list[str]]  # [file name, sha256] of each wheel in the store


class EnvRequest(EnvBase, total=False):
    system_site_packages: bool
    installer: str  # "auto" (uv when its wheel is among the wheels), "uv", "pip"
    online: bool  # wheels_from = "hosts": the host's pip and its configuration, online
    words: list[str]  # first words of the tasks' commands to compare (see interpreters)


class EnvProgressRequest(TypedDict):
    hash: str  # the environment being built (WORKDIR/envs/<hash>/)
    names: list[str]  # the projects it installs, normalized (lower case, runs of -_. as _)


class EnvProgressReply(TypedDict):
    installed: int  # how many of `names` the venv holds now (a .dist-info of theirs)
    complete: bool  # the venv is built (its marker is there)


class EnvReply(TypedDict):
    venv: str
    built: bool  # false: a complete venv of this hash was reused
    waited: bool  # another build of it (another host of a shared workdir, another job) ran first
    installer: str | None  # null when reused
    seconds: float
    python: str  # the venv's Python version
    tensorflow: str | None  # the TensorFlow version installed in the venv (null: none)
    interpreters: InterpretersShape  # checked: the venv's python


class ImageBase(TypedDict):
    run_id: str
    action: str  # "check" (preflight) or "load" (after the push)
    image: str


class ImageRequest(ImageBase, total=False):
    runtime: str  # the inventory's container_runtime; absent: podman, else docker
    gpus: bool  # check: some task of this host has GPUs (the GPU runtime must be there)
    pull: bool  # check: pull the image when the host lacks it (image_from = "hosts")
    index: str  # load: the OCI layout's index.json, as the controller saved it
    blobs: list[str]  # load: the layout's blobs (sha256), in the store already (push `keep`)
    mounts: list[str]  # the job's container_mounts: the throwaway container mounts them too
    pythons: list[str]  # the tasks' first words naming a Python: whose TensorFlow the trial reads


class ImageFacts(TypedDict):
    runtime: str  # the runtime found
    rootless: bool
    platform: str  # the host's, "linux/amd64"
    present: bool  # the image is in this host's store now (pulled or loaded if asked)
    pulled: bool  # check with pull: the host pulled it now
    image_platform: str | None  # the image's os/arch; null while it is absent


class ImageReply(ImageFacts, total=False):
    tried: bool  # a throwaway container of the image ran here (the image is present)
    tensorflow: str | None  # the image's TensorFlow (its python3's), null: none or no Python


# The replies of the ops with several actions, one shape per action (Union: `|` between
# classes fails on the host's Python 3.8).
FirewallReply = Union[
    FirewallCheckReply, FirewallRulesReply, FirewallListReply, FirewallRemoveReply
]
NetcheckReply = Union[ListenReply, ProbeReply, ClosedReply]
PeersReply = Union[PeersPidReply, ChainReply, ClosedReply]
