"""The wire shapes of the host's ops beside a run's own: GPUs, the firewall, the network check,
files home (collect, fetch), the idle watchdog, peers, prune, environments and images.

Split from shapes.py (a run's hello, push, start, poll, stop and runs) only to keep each module
readable; protocol.py names the shapes of both, as one vocabulary.
"""

from __future__ import annotations

from typing import Any, Final, TypedDict, Union

if __package__:  # the control side: remote is a package
    from remote.shapes import InterpretersShape
else:  # a host: the agent's files side by side
    from shapes import InterpretersShape  # type: ignore[no-redef, unused-ignore]


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


class ProfileBase(TypedDict):
    run_id: str
    seconds: float  # how long each trace lasts (at most MAX_PROFILE_SECONDS)
    start_in: float  # each trace starts this long after the host read the request
    stamp: str  # this capture's folder in each task's directory: profile/<stamp>/


class ProfileRequest(ProfileBase, total=False):
    tasks: list[str]  # only these (role:index); absent: every task of the run on the host


class ProfiledShape(TypedDict):
    """One task of a `profile` reply: traced, or why not."""

    name: str
    serves: bool  # it has a profiler port ([job] profiler, a TensorFlow task)
    traced: bool
    why: str | None  # not traced: not running, no profiler port, the trace's own error
    started_after: float | None  # seconds from the request's arrival to the trace's start
    files: int  # the trace files written (.xplane.pb)
    folder: str | None  # where: the task's profile/<stamp>/ on this host (absolute)


class ProfileReply(TypedDict):
    tasks: list[ProfiledShape]


MAX_PROFILE_SECONDS: Final = 300.0  # one trace; TensorFlow keeps a whole trace in memory
MAX_PROFILE_START_IN: Final = 120.0
PROFILE_WRITE_SECONDS: Final = 90.0  # past the trace: the server serializes it, the client writes


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


class KeepBase(TypedDict):
    action: str  # KEEP_*
    run_id: str
    secret: str  # the run's keeper secret (hex): over SSH only, never written down


class KeepRequest(KeepBase, total=False):
    address: str  # warden: this host's cluster address, where it listens
    idle_seconds: float  # warden: leaves after this long unasked while no task runs here
    plan: dict[str, Any]  # keeper: the run's hosts (and their wardens), tasks and policy


class KeepWardenReply(TypedDict):
    port: int  # the warden's port on the cluster address
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
    # jobs whose own checkpoint folder ([job] checkpoint_dir, relative) went with their last run
    checkpoints: list[str]
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


class EnvFacts(TypedDict):
    venv: str
    built: bool  # false: a complete venv of this hash was reused
    waited: bool  # another build of it (another host of a shared workdir, another job) ran first
    installer: str | None  # null when reused
    seconds: float
    python: str  # the venv's Python version
    tensorflow: str | None  # the TensorFlow version installed in the venv (null: none)
    interpreters: InterpretersShape  # checked: the venv's python


class EnvReply(EnvFacts, total=False):
    # The frameworks beside TensorFlow the venv's python has (hostfacts.FRAMEWORK_DISTRIBUTIONS,
    # from package metadata, none imported), as the hello's `frameworks`: {"torch": "2.13.0"}
    frameworks: dict[str, str]


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
    # The same python's frameworks beside TensorFlow, as the hello's `frameworks`; absent: not
    # read (no Python, or one without importlib.metadata: 3.7 and older)
    frameworks: dict[str, str]


# The replies of the ops with several actions, one shape per action (Union: `|` between
# classes fails on the host's Python 3.8).
FirewallReply = Union[
    FirewallCheckReply, FirewallRulesReply, FirewallListReply, FirewallRemoveReply
]
NetcheckReply = Union[ListenReply, ProbeReply, ClosedReply]
PeersReply = Union[PeersPidReply, ChainReply, ClosedReply]
KeepReply = Union[KeepWardenReply, PeersPidReply]
