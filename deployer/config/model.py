"""The inventory as data: hosts, how to reach them, their tasks and the job; frozen, no I/O.

inventory.py reads a file into these; every other layer only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from deployer.config.frameworks import Framework
from remote import protocol


class FailurePolicy(StrEnum):
    """job.on_failure: what a failed task does to the job."""

    TEARDOWN = "teardown"  # stop everything, exit 1
    RESTART = "restart"  # start the failed task again (PSS: a worker or ps rejoins)
    RESTART_JOB = "restart-job"  # stop every task, start them all again from the checkpoint


class NetcheckMode(StrEnum):
    """job.netcheck / --netcheck: which TF connections preflight tries (deployer/up/netplan.py)."""

    AUTO = "auto"  # every one up to netplan.FULL_UP_TO hosts, a sample above (true)
    FULL = "full"  # every one, at any size
    SAMPLED = "sampled"  # a sample, at any size
    OFF = "off"  # none (false, --no-netcheck)


class Profiler(StrEnum):
    """job.profiler: who starts TensorFlow's profiler server in each TF task, on the port
    tfdeploy plans for it (TFDEPLOY_PROFILER_PORT), for `tfdeploy profile` (docs/profile.md)."""

    OFF = "off"  # no server, no port (false)
    TFDEPLOY = protocol.PROFILER_BY_TFDEPLOY  # tfdeploy starts it once TF is imported (true)
    TASK = protocol.PROFILER_BY_TASK  # the task's own code starts it on TFDEPLOY_PROFILER_PORT


class Strategy(StrEnum):
    """job.strategy: the tf.distribute strategy the job's script builds."""

    AUTO = "auto"  # no ps tasks: "mwms"; ps tasks: "pss" (a missing chief is then a warning)
    MWMS = "mwms"  # MultiWorkerMirroredStrategy: chief and workers all-reduce
    PSS = "pss"  # ParameterServerStrategy: a chief coordinates, workers and ps serve
    MIRRORED = "mirrored"  # MirroredStrategy per task (TF_CONFIG unread): no cluster rule
    TF1 = "tf1"  # TF1 between-graph replication: workers and ps, worker 0 leads


class EvaluatorFailure(StrEnum):
    """job.evaluator_failure: what a failed evaluator does to a job whose training succeeded."""

    REPORT = "report"  # reported when it happens and in the last line; the job's outcome stands
    FAIL = "fail"  # a failure like any other: the job fails (exit 1), on_failure applies


@dataclass(frozen=True)
class SSHSettings:
    """How to reach a host; [ssh] gives the defaults and a host's own `ssh` table overrides them."""

    user: str | None = None
    port: int = 22
    identity: str | None = None
    jump: str | None = None
    host_keys: str = "strict"
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    ssh_config: str | None = None
    # SHA256 fingerprints the host's key must have, learnt out of band (a new EC2 instance's
    # console output): a key matching one is recorded in known_hosts, any other refused.
    expected_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    """One `tasks` entry of a host; `count` copies of it become tasks of the plan."""

    role: str
    count: int = 1
    gpus: tuple[int, ...] | None = None
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    threads: int | None = None  # TF intra/inter-op and OpenMP threads for this task
    cpus: str | None = None  # CPU list to pin the task to, e.g. "0-3" or "0,2"
    key: str = ""  # key path in the inventory, for messages about this entry


GPU_HEALTH_MODES = ("check", "warn", "off")


@dataclass(frozen=True)
class GpuPolicy:
    """How preflight judges a host's GPUs and how long teardown waits for them (docs/gpus.md).
    The defaults are the inventory's."""

    health: str = "check"  # gpu_health: a bad GPU fails preflight; "warn": a warning; "off"
    max_ecc_errors: int = 0  # uncorrectable volatile ECC errors a planned GPU may have
    allow_busy: bool = False  # allow_busy_gpus: others' compute processes on a planned GPU
    release_s: float = 30.0  # gpu_release_s: how long the driver gets to free a stopped run's GPUs


# `requirements`: a file relative to the job's `code` directory, or the requirement lines
# themselves (docs/environments.md). None: no environment of the job's own.
Requirements = str | tuple[str, ...] | None


class WheelsFrom(StrEnum):
    """Where an environment's wheels come from."""

    CONTROLLER = "controller"  # this machine resolves; the wheels travel with the code
    HOSTS = "hosts"  # each host's own pip, index or mirror (online), its own configuration


class Installer(StrEnum):
    """What builds an environment's venv on the hosts (docs/environments.md#pip-or-uv)."""

    UV = "uv"  # uv's wheel travels with the environment; pip where none exists for the host
    PIP = "pip"  # the venv's own pip (ensurepip)


class ImageFrom(StrEnum):
    """Where a job's container image comes from (docs/containers.md)."""

    HOSTS = "hosts"  # each host pulls it with its own registry access, once, before the run
    CONTROLLER = "controller"  # saved here as an OCI layout, sent with the code, loaded there


@dataclass(frozen=True)
class Via:
    """How a host that is not reached directly is reached: commands run on `login` (over SSH
    with the host's `ssh` settings, or on this machine when "local"), each wrapped in
    `launcher` (a scheduler's step launcher: `srun --jobid=J --overlap -w NODE ... --`)."""

    login: str
    launcher: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Host:
    """A host of the inventory; the defaults are a `[[hosts]]` entry's (the parser reads them)."""

    name: str
    address: str
    tf_address: str
    port: int
    gpus: int = 0
    share_gpus: bool = False
    transport: str = "ssh"
    python: str
    workdir: str
    ssh: SSHSettings
    tasks: tuple[TaskSpec, ...]
    key: str = ""
    gpus_auto: bool = False  # gpus = "auto": `gpus` is 0 until preflight asks nvidia-smi
    gpu_policy: GpuPolicy = GpuPolicy()
    # Where the machine announces its own coming interruption (a spot instance's metadata
    # service); its tasks' supervisors watch it and stop them in time. None: not watched.
    interruption_url: str | None = None
    # Shut the machine down after this many minutes without a running task (0: never); set for
    # machines tfdeploy launched itself, so a forgotten fleet stops costing money.
    idle_minutes: float = 0.0
    idle_command: str | None = None  # how it stops itself; None: the agent's shutdown default
    requirements: Requirements = None  # the job's unless the host entry says otherwise
    image: str | None = None  # the job's container image unless the host entry says otherwise
    container_runtime: str | None = None  # podman or docker; None: podman, else docker
    # The GPU indices the host's `gpus` are, when a scheduler granted some of a node's GPUs
    # (Slurm's IDX); a task's GPU i is gpu_ids[i]. Empty: 0..gpus-1.
    gpu_ids: tuple[int, ...] = ()
    via: Via | None = None  # reached through a login node and a launcher; None: directly


@dataclass(frozen=True)
class HostSettings:
    """What a host entry says besides where the host is; `[[hosts]]` and sources read it alike."""

    port: int
    gpus: int
    gpus_auto: bool
    share_gpus: bool
    gpu_policy: GpuPolicy
    python: str
    workdir: str
    ssh: SSHSettings
    tasks: tuple[TaskSpec, ...]
    requirements: Requirements = None
    image: str | None = None
    container_runtime: str | None = None


@dataclass(frozen=True)
class TensorBoard:
    """[job.tensorboard]: TensorBoard beside a task (not in TF_CONFIG), forwarded by `up`."""

    logdir: str  # relative to the task's directory, or absolute, on that host
    port: int = 6006  # on that host's loopback
    task: str | None = None  # whose host runs it; default chief:0, else worker:0


NOTIFY_EVENTS = ("started", "recovered", "failed", "finished")


@dataclass(frozen=True)
class GpuIdleStop:
    """[job] gpu_idle_stop: the run stops once every GPU its tasks were given has been below
    `below` % utilization for `minutes` (docs/up.md, "Guards"). Applied by whoever holds the run:
    its keeper, or an attached `up`."""

    below: float  # percent, 0 < below <= 100
    minutes: float  # the window, > 0


@dataclass(frozen=True)
class Notify:
    """[job.notify]: who hears of the run's turns (docs/up.md, "Notifications"). Fired by
    whoever holds the run: its keeper (on the keeper's host) or `up` (on this machine)."""

    # POSTed a JSON document per event; it may hold a token: never shown, nor in a repr
    webhook: str | None = field(default=None, repr=False)
    command: str | None = None  # run by `sh -c` with TFDEPLOY_EVENT, _RUN_ID, _OUTCOME, ...
    events: tuple[str, ...] = NOTIFY_EVENTS


@dataclass(frozen=True, kw_only=True)
class Job:
    """[job]. Every default here is the inventory's: the parser reads them from this class
    (config/inventory.py), so a key left out gets exactly what is written below."""

    name: str
    code: Path
    command: str | None = None
    python: str = "python3"
    workdir: str = "~/.tfdeploy"
    port: int = 2222
    env: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    role_commands: dict[str, str]  # the roles' built-in commands (config/roles.py) when unset
    secret_env: tuple[str, ...] = ()
    start_timeout: float = 120.0
    stop_grace: float = 10.0
    evaluator_grace: float = 60.0
    on_failure: FailurePolicy = FailurePolicy.TEARDOWN
    evaluator_failure: EvaluatorFailure = EvaluatorFailure.REPORT
    max_restarts: int = 3  # per task with "restart", of the whole job with "restart-job"
    restart_backoff: float = 10.0  # seconds before the first whole-job restart; doubles, <= 5 min
    retry_exit_codes: tuple[int, ...] | None = None  # restart-job: exit codes worth a retry
    stall_timeout: float | None = None  # fail when awaited tasks are silent this long
    gpu_idle_stop: GpuIdleStop | None = None  # stop the run when its GPUs sit idle this long
    lease_seconds: float = 60.0  # hosts stop a non-detached run whose controller is this silent
    keeper: bool = True  # detached runs (attached restarting ones) go to a keeper (up/handover.py)
    # The job's checkpoint folder on each host, TFDEPLOY_CHECKPOINT_DIR to every task: every
    # attempt and every later run of the job sees it. Relative: the job's own folder under the
    # workdir (jobs/<name>/, removed by `prune` once no run of the job is left); absolute or ~:
    # the user's (shared storage), never removed.
    checkpoint_dir: str | None = None
    firewall: bool = False  # TF ports accept only the cluster's own addresses during the run
    profiler: Profiler = Profiler.OFF  # TF tasks serve TensorFlow's profiler (`tfdeploy profile`)
    profiler_port: int = 9012  # each host's first profiler port; its next TF task the next one
    strategy: Strategy = Strategy.AUTO  # the tf.distribute strategy, for plan's rules (tfrules.py)
    # The cluster convention the tasks read (config/frameworks.py): TF_CONFIG, or the variables
    # of Keras 3, JAX or torchrun; per role with role_frameworks.
    framework: Framework = Framework.TENSORFLOW
    role_frameworks: dict[str, Framework] = field(default_factory=dict)
    netcheck: NetcheckMode = NetcheckMode.AUTO  # preflight tries TF connections (netplan.py)
    fanout: bool = True  # hosts copy the code to each other; the uplink carries it once (fanout.py)
    require_tensorflow: bool = True  # false: a job that does not use TF (data prep, a smoke test)
    # true: the tasks may run different TensorFlow versions (up/tfrule.py says which run which)
    allow_mixed_tensorflow: bool = False
    artifacts: tuple[str, ...] = ()  # pulled home when `up` ends, however it ends (results/pull/)
    artifacts_to: str = "tfdeploy-runs"  # into DIR/<run-id>/<role>-<index>/ (relative: the cwd)
    tensorboard: TensorBoard | None = None
    notify: Notify | None = None
    forward_env: tuple[str, ...] = ()  # names copied from the controller's environment
    # The job's Python environment (deployer/envs, docs/environments.md): a venv per host built
    # on `python` from these requirements; per host (`[[hosts]] requirements`) and per role.
    requirements: Requirements = None
    role_requirements: dict[str, Requirements] = field(default_factory=dict)
    system_site_packages: bool = False  # the venv sees the base python's packages (a CUDA AMI)
    wheels_from: WheelsFrom = WheelsFrom.CONTROLLER
    installer: Installer = Installer.UV  # builds the venvs on the hosts (deployer/envs/uv.py)
    # Tasks in a container image (docs/containers.md): per host (`[[hosts]] image`) and per
    # role (`role_images`), as requirements are.
    image: str | None = None
    role_images: dict[str, str] = field(default_factory=dict)
    image_from: ImageFrom = ImageFrom.HOSTS
    container_runtime: str | None = None  # podman or docker; None: podman, else docker
    container_mounts: tuple[str, ...] = ()  # host paths at the same path inside; PATH:ro
