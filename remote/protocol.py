"""What the control side and the host agent must agree on, defined once (docs/PROTOCOL.md).

Both sides import this file: the agent as a top-level module next to it on the host, the
control side as `remote.protocol`. So it stays stdlib-only and runs on Python 3.8.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

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
OP_KEEP: Final = "keep"
OP_PROFILE: Final = "profile"
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
    OP_KEEP,
    OP_PROFILE,
)
# The ops whose processes outlive the session that asked: on a Slurm node a session started as a
# job step hands them to the allocation's holder step (holder.py), which outlives every session.
HELD_OPS: Final = (OP_START, OP_KEEP)
HOLDER_ENV: Final = "TFDEPLOY_HOLDER"  # set on such a session: the job id of its holder

# The "action" of the ops that have several: firewall, netcheck, peers.
FIREWALL_CHECK: Final = "check"
FIREWALL_ADD: Final = "add"
FIREWALL_REMOVE: Final = "remove"
FIREWALL_LIST: Final = "list"
NETCHECK_LISTEN: Final = "listen"
NETCHECK_PROBE: Final = "probe"
NETCHECK_CLOSE: Final = "close"
PEERS_RELAY: Final = "relay"
KEEP_WARDEN: Final = "warden"  # keep: this host's warden of a kept run (remote/warden.py)
KEEP_KEEPER: Final = "keeper"  # keep: the run's keeper (remote/keeper.py)
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
# Its machine or allocation is being taken away, and it was told: a spot interruption notice
# (the supervisor's SIGTERM), or a scheduler's warning (Slurm's time limit, passed on by
# relay.py). Exiting 0 after one is no success: the work was cut short.
REASON_PREEMPTED: Final = "preempted"
# A notice's "action" when a scheduler warned (the spot ones are IMDS's: terminate, stop, ...).
NOTICE_TIME_LIMIT: Final = "time-limit"
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
# The job's checkpoint folder on this host ([job] checkpoint_dir), set by the agent at the start:
# the same for every attempt and every later run of the job (taskops.checkpoint_path).
CHECKPOINT_ENV: Final = "TFDEPLOY_CHECKPOINT_DIR"
# The port a TF task's profiler server listens on ([job] profiler, docs/profile.md), planned by
# the controller per task; PROFILER_START_ENV = "tfdeploy" when tfdeploy starts the server in the
# task (taskside/sitecustomize.py), "task" when the task's own code does.
PROFILER_PORT_ENV: Final = "TFDEPLOY_PROFILER_PORT"
PROFILER_START_ENV: Final = "TFDEPLOY_PROFILER_START"
PROFILER_BY_TFDEPLOY: Final = "tfdeploy"
PROFILER_BY_TASK: Final = "task"
TASK_ENV_NAMES: Final = (
    RUN_ID_ENV,
    TASK_ENV,
    ATTEMPT_ENV,
    HOST_ID_ENV,
    METRICS_ENV,
    CHECKPOINT_ENV,
    PROFILER_PORT_ENV,
    PROFILER_START_ENV,
)

# An op's result may carry, under this key, a function that writes raw bytes to the agent's
# stdout after the reply line; the reply's "raw" field says how many (never sent as JSON).
RAW_BODY: Final = "_raw_body"
if TYPE_CHECKING:  # the agent's own: no wire shape names it, so the control side never reads it
    from typing import BinaryIO, Callable, TypedDict

    class RawBody(TypedDict, total=False):
        """RAW_BODY beside an op's reply fields: what writes the bytes its "raw" counts."""

        _raw_body: Callable[[BinaryIO], None]


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


# The wire shapes (each op's request and reply) are in shapes.py and hostshapes.py; protocol
# names them too, so both sides write protocol.HelloReply. A host imports the agent's files side
# by side; the control side imports them as the package `remote`.
if __package__:
    from remote.hostshapes import *  # noqa: F403
    from remote.shapes import *  # noqa: F403
else:  # pragma: no cover - on a host
    from hostshapes import *  # noqa: F403
    from shapes import *  # noqa: F403
