"""What tfdeploy hands Slurm: the sbatch options, the allocation's body, the keeper, the steps.

The body holds the allocation and nothing else: it runs on the first node while the controller's
lease is fresh, and ends (ending the allocation, freeing its GPUs) once the lease lapses. The
keeper is a step on that node that renews the lease while the controller's connection to it
stays open: a controller that is SIGKILLed or loses its network closes it, and the allocation
ends `lease_seconds` later without anyone's help (a leaked allocation holds GPUs for days
elsewhere). A detached run hands the allocation over to its tasks ("detached": the body ends
when no task of the user's is left on any node), a kept one to the next `up` ("keep").

The body also starts the holder step: one task per node with all the job has there, in which
the agents' starts run (remote/holder.py), so that a run's processes live as long as the
allocation and not as long as the session step that asked for them (proctrack/cgroup kills a
step's processes when it ends).
"""

from __future__ import annotations

import hashlib
import shlex
from urllib.parse import quote, unquote

from deployer.hosts.bootstrap import agent_id
from deployer.sources.slurm.outputs import short
from deployer.sources.slurm.settings import SlurmSettings
from remote import protocol

LEASE_DIR = "/tmp"  # the lease file lives on the first node; both body and keeper see it
BEAT_S = 2  # how often the keeper renews the lease
DETACHED_CHECK_S = 30  # how often a detached run's body looks for tasks left on the nodes
HOLDER_POLL_S = 1  # how often a node's holder step looks for the agent's code, until it is there


def lease_path(job_id: str) -> str:
    return f"{LEASE_DIR}/tfdeploy-slurm-{job_id}.lease"


# What the allocation's comment says tfdeploy asked for: how a later `up` with keep_allocation
# tells whether the kept allocation is the one its inventory asks (docs/slurm.md).
REQUEST_TAG = "tfdeploy-request:"


def request(settings: SlurmSettings) -> dict[str, str]:
    """What shapes the allocation, by name: the [slurm] keys sbatch is given, the options of
    the user's own and the body (its lease, its signal relay, the agents' places), as texts.
    Tasks, roles, the command and the code are not in it: a kept allocation runs new ones."""
    options = "\0".join(settings.sbatch_options)
    return {
        "partition": settings.partition,
        "nodes": str(settings.nodes),
        "time": settings.time,
        "gpus": str(settings.gpus_per_node),
        "account": settings.account or "-",
        "qos": settings.qos or "-",
        "constraint": settings.constraint or "-",
        "reservation": settings.reservation or "-",
        "exclusive": "yes" if settings.exclusive else "no",
        "requeue": "yes" if settings.requeue else "no",
        "signal": f"{settings.signal[0]}@{settings.signal[1]}" if settings.signal else "-",
        "sbatch_options": _digest(options) if options else "-",
        "body": _digest(body(settings)),
    }


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def request_comment(settings: SlurmSettings) -> str:
    """`request` as one word for `sbatch --comment` (no space: scontrol's Key=Value form)."""
    pairs = (f"{k}={quote(v, safe='')}" for k, v in request(settings).items())
    return REQUEST_TAG + ";".join(pairs)


def request_of(comment: str) -> dict[str, str] | None:
    """A job's comment read back as `request`'s texts; None: not a comment tfdeploy wrote."""
    if not comment.startswith(REQUEST_TAG):
        return None
    found = {}
    for pair in comment[len(REQUEST_TAG) :].split(";"):
        key, equal, value = pair.partition("=")
        if not equal:
            return None
        found[key] = unquote(value)
    return found


def request_differences(settings: SlurmSettings, comment: str) -> list[str]:
    """What the kept allocation was asked with that this inventory asks otherwise, as
    "partition debug (this inventory: urgent)"; [] when it is the same request."""
    asked = request(settings)
    kept = request_of(comment)
    if kept is None:
        return ["its request (it was not submitted by this tfdeploy: no request comment)"]
    return [
        f"{key} {short(kept.get(key, '(none)'))} (this inventory: {value})"
        for key, value in asked.items()
        if kept.get(key) != value
    ]


def sbatch_argv(settings: SlurmSettings, *, test_only: bool = False) -> list[str]:
    """The options of the one allocation: every node at once (gang-scheduled)."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={settings.job_name}",
        f"--comment={request_comment(settings)}",
        f"--partition={settings.partition}",
        f"--nodes={settings.nodes}",
        "--ntasks-per-node=1",
        f"--time={settings.time}",
        "--output=/dev/null",
        f"--chdir={LEASE_DIR}",
    ]
    if settings.gpus_per_node:
        argv.append(f"--gres=gpu:{settings.gpus_per_node}")
    optional = {
        "--account": settings.account,
        "--qos": settings.qos,
        "--constraint": settings.constraint,
        "--reservation": settings.reservation,
        "--signal": f"B:{settings.signal[0]}@{settings.signal[1]}" if settings.signal else None,
    }
    argv += [f"{name}={value}" for name, value in optional.items() if value is not None]
    if settings.exclusive:
        argv.append("--exclusive")
    if settings.requeue:
        argv.append("--requeue")  # before the user's options: their --no-requeue wins
    argv += settings.sbatch_options
    if test_only:
        argv.append("--test-only")
    return argv


def body(settings: SlurmSettings) -> str:
    """The batch script: holds the allocation while the lease is fresh (see the module's doc)."""
    lease = int(settings.lease_seconds)
    relay = ""
    if settings.signal:
        name = settings.signal[0]
        relay = f"""relay() {{
  echo "SIG{name}: passed to the run's tasks"
  {on_every_node(settings, name)} || true
}}
trap relay {name}
"""
    return f"""#!/bin/sh
# tfdeploy: holds this allocation for job {settings.job!r} while its controller's lease is fresh.
lease={LEASE_DIR}/tfdeploy-slurm-$SLURM_JOB_ID.lease
touch "$lease"
trap 'rm -f "$lease" "$lease.mode"' EXIT
trap 'exit 0' TERM INT
{relay}{holder_step(settings)} &
idle=0
while :; do
  mode=$(cat "$lease.mode" 2>/dev/null || true)
  case $mode in
  keep) sleep {BEAT_S} ;;
  detached)
    sleep {DETACHED_CHECK_S}
    left=$({on_every_node(settings, "0")} 2>/dev/null || true)
    if [ -z "$left" ]; then idle=$((idle + 1)); else idle=0; fi
    if [ "$idle" -ge 2 ]; then echo "no task of the run is left"; exit 0; fi ;;
  *)
    now=$(date +%s)
    beat=$(stat -c %Y "$lease" 2>/dev/null || echo 0)
    if [ $((now - beat)) -gt {lease} ]; then echo "the controller's lease lapsed"; exit 0; fi
    sleep {BEAT_S} ;;
  esac
done
"""


def holder_step(settings: SlurmSettings) -> str:
    """The step that holds the run's processes on every node (remote/holder.py): one task per
    node with every resource the job has there (`--whole`: its CPUs and GPUs, not one task's
    share), alive until the allocation ends. It waits for the agent's code, which the
    controller sends once the allocation runs, and becomes the agent's holder. Under
    proctrack/cgroup what an agent's session step starts dies with that step; what this step
    starts lives as long as the allocation (docs/slurm.md, "Process tracking")."""
    lease = lease_path("$SLURM_JOB_ID")  # a requeued holder tells the body a run goes on
    hold = f'exec "$1" -S "$agent" hold "$SLURM_JOB_ID" "$wd" "{lease}"'
    return _step_on_every_node(settings, hold, "--whole ", wait=HOLDER_POLL_S)


def on_every_node(settings: SlurmSettings, signal: str) -> str:
    """A step on every node in which each group's agent sends `signal` to the process groups
    its runs recorded, of tasks started in this allocation only ("0": lists them, signals
    nothing; remote/relay.py). Never a process found by its name: another job of the user's on
    a shared node is not this run's."""
    relay = f'"$1" -S "$agent" signal-tasks "$wd" {signal} "$SLURM_JOB_ID"'
    return _step_on_every_node(settings, relay)


def _step_on_every_node(
    settings: SlurmSettings, action: str, options: str = "", *, wait: int = 0
) -> str:
    """One task per node, which runs `action` for each of the groups' places (python, workdir)
    whose agent is on the node (`$1` the python, `$wd` the workdir, `$agent` the agent's file);
    `wait`: again every `wait` seconds, until an action execs (the holder waits for its agent)."""
    places = sorted({(g.settings.python, g.settings.workdir) for g in settings.groups})
    calls = "\n".join(f"at_place {shlex.quote(py)} {shlex.quote(wd)}" for py, wd in places)
    if wait:
        calls = f"while :; do\n{calls}\nsleep {wait}\ndone"
    script = f"""at_place() {{
  wd=$2
  case $wd in "~/"*) wd=$HOME/${{wd#"~/"}};; "~") wd=$HOME;; esac
  agent=$wd/agent/{agent_id()}/agent.py
  [ ! -f "$agent" ] || {action}
}}
{calls}
"""
    return (
        f'srun --overlap {options}-N"$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 -Q '
        f"sh -c {shlex.quote(script)}"
    )


# The keeper: renews the lease every BEAT_S seconds while its stdin is open, answers "ok" to
# every line, and records a mode ("detached", "keep") it is sent. At EOF it ends, and its renewing
# loop with it.
KEEPER = f"""
p=$1
touch "$p"
(while kill -0 $$ 2>/dev/null; do touch "$p"; sleep {BEAT_S}; done) &
while read -r word; do
  case $word in detached|keep) echo "$word" > "$p.mode" ;; esac
  echo ok
done
"""


def keeper_argv(job_id: str) -> list[str]:
    return ["sh", "-c", KEEPER, "tfdeploy-keeper", lease_path(job_id)]


def step_launcher(job_id: str, node: str) -> tuple[str, ...]:
    """How a command becomes a step of the allocation on `node`: beside the other steps
    (`--overlap`), one task, unbuffered both ways (the agent's replies arrive at once)."""
    return (
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--unbuffered",
        "--quiet",
        # What this session starts to outlive it (tasks, keeper) goes to the holder step.
        f"--export=ALL,{protocol.HOLDER_ENV}={job_id}",
        "--",
    )
