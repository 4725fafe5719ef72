"""Turns an inventory into the exact list of tasks: roles, indices, ports, GPUs, TF_CONFIG.

This is pure computation: `plan` and `up` print and run the same Plan, so what a user previews is
what every host receives.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from deployer.config.containers import check_images
from deployer.config.frameworks import RANK_ROLES, RECORDS, Framework, Rank, ranks
from deployer.config.inventory import Inventory
from deployer.config.model import FailurePolicy, Host, Job, Profiler, TaskSpec
from deployer.config.roles import (
    AWAITED_ROLES,
    BUILTIN_SERVER,
    CLUSTER_ROLES,
    LEAD_TASKS,
    ROLE_NAMES,
    SIDECAR,
    TF_ROLES,
    has_port,
    role,
)
from deployer.config.tfrules import check as check_tf_rules
from deployer.config.tfrules import warnings as tf_warnings
from deployer.core.errors import InventoryError
from remote import protocol

PLACEHOLDERS = ("task_type", "task_index", "chief_hosts", "worker_hosts", "ps_hosts")
# Set by tfdeploy for each task; the hint says what to write instead. The TFDEPLOY_* names are
# protocol.TASK_ENV_NAMES, every one of them (tests/unit/test_plan.py checks).
RESERVED_ENV = {
    "TF_CONFIG": "remove it: tfdeploy builds it from the hosts and tasks of the inventory",
    "CUDA_VISIBLE_DEVICES": "remove it; use gpus = [...] to choose GPUs",
    protocol.RUN_ID_ENV: "remove it: each run gets its own id",
    protocol.TASK_ENV: "remove it: it names the task (role:index) the process runs",
    protocol.ATTEMPT_ENV: "remove it: it counts the whole job's restarts (on_failure = "
    '"restart-job"), 0 first',
    protocol.HOST_ID_ENV: "remove it: it names the host a task runs on, so that a stop never "
    "takes another host's processes",
    protocol.METRICS_ENV: "remove it: it names the task's metrics file (docs/metrics.md)",
    protocol.CHECKPOINT_ENV: "remove it; use checkpoint_dir = ... in [job]: every host makes "
    "the folder and names it there",
    protocol.PROFILER_PORT_ENV: "remove it; use profiler_port = ... in [job]: each TF task gets "
    "its own port from there",
    protocol.PROFILER_START_ENV: 'remove it; use profiler = true or "task" in [job]',
}


def host_port(address: str, port: int | None) -> str:
    """HOST:PORT as gRPC and TF_CONFIG want it: an IPv6 address goes in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class Task:
    """One process of the job on one host, with everything it will be started with."""

    role: str
    index: int
    host: str
    address: str  # the tf_address other tasks use to reach it
    port: int | None  # None for evaluators: no task dials them
    gpus: tuple[int, ...]
    command: str
    own_env: dict[str, str]  # the inventory's env for this task (threads, job, task)
    cpus: str | None = None  # CPU list the task is pinned to on its host ("0-3"), or None
    # The cluster as JSON, one string shared by every task: a TF_CONFIG per task, kept whole,
    # would make a plan of n tasks hold n copies of an O(n) cluster (2,000 hosts: 78 MB). An
    # evaluator's is its own: it alone (roles.py, `lists_only_itself`).
    cluster_json: str = field(default="{}", repr=False)
    framework: Framework = Framework.TENSORFLOW  # the cluster convention it reads
    rank: Rank | None = field(default=None, repr=False)  # outside TensorFlow: its rank
    # [job] checkpoint_dir: its host resolves it, makes it and sets TFDEPLOY_CHECKPOINT_DIR.
    checkpoint_dir: str | None = None
    # [job] profiler: the port its TensorFlow profiler server listens on (`tfdeploy profile`),
    # and who starts that server; None: a task that serves none (off, or not TensorFlow).
    profiler_port: int | None = None
    profiler: Profiler = Profiler.OFF

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def env(self) -> dict[str, str]:
        """Everything the task is started with: its own env, then what tfdeploy sets."""
        return {
            **self.own_env,
            **self.cluster_env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus),
            protocol.TASK_ENV: self.name,
            **self.profiler_env,
        }

    @property
    def profiler_env(self) -> dict[str, str]:
        if self.profiler_port is None:
            return {}
        return {
            protocol.PROFILER_PORT_ENV: str(self.profiler_port),
            protocol.PROFILER_START_ENV: self.profiler.value,
        }

    @property
    def cluster_env(self) -> dict[str, str]:
        """The variables of its convention: TF_CONFIG, or its rank's (config/frameworks.py)."""
        if self.rank is not None:
            return RECORDS[self.framework].env(self.rank)
        task = json.dumps({"type": self.role, "index": self.index})
        return {"TF_CONFIG": f'{{"cluster": {self.cluster_json}, "task": {task}}}'}

    @property
    def endpoint(self) -> str:
        return host_port(self.address, self.port)

    @property
    def is_server(self) -> bool:
        return self.command == BUILTIN_SERVER

    @property
    def awaited(self) -> bool:
        """The job ends when every awaited task has exited; servers and evaluators never end."""
        return role(self.role).awaited and not self.is_server

    @property
    def serves(self) -> bool:
        """A server the others depend on (a ps, or a task running the built-in server)."""
        return self.is_server or role(self.role).serves


@dataclass(frozen=True)
class Plan:
    inventory: Inventory
    tasks: tuple[Task, ...]
    cluster: dict[str, list[str]]

    @property
    def job(self) -> Job:
        return self.inventory.job

    @cached_property
    def hosts(self) -> tuple[Host, ...]:
        """Hosts that run at least one task, in inventory order."""
        used = {t.host for t in self.tasks}
        return tuple(h for h in self.inventory.hosts if h.name in used)

    def with_hosts(self, hosts: Iterable[Host]) -> Plan:
        """The same job planned over other hosts: the one re-plan, for the rare callers that
        learn something about the hosts after the first plan (GPU counts, a replacement)."""
        return make_plan(dataclasses.replace(self.inventory, hosts=tuple(hosts)))

    @cached_property
    def warnings(self) -> tuple[str, ...]:
        """TensorFlow's rules this plan breaks without TF refusing it (config/tfrules.py).
        Hosts with `gpus = "auto"` and no count yet are left to preflight."""
        unknown = {h.name for h in self.inventory.hosts if h.gpus_auto and not h.gpus}
        return tuple(tf_warnings(self.job.strategy, self.tasks, unknown))

    def tasks_on(self, host: str) -> tuple[Task, ...]:
        return self._by_host.get(host, ())

    def task(self, name: str) -> Task:
        return self._by_name[name]

    @cached_property
    def _by_host(self) -> dict[str, tuple[Task, ...]]:
        # Indexed once: callers ask per host and per tick, which a scan would make O(hosts^2).
        grouped: dict[str, list[Task]] = {}
        for t in self.tasks:
            grouped.setdefault(t.host, []).append(t)
        return {host: tuple(tasks) for host, tasks in grouped.items()}

    @cached_property
    def _by_name(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks}


@dataclass(frozen=True)
class _Slot:
    """A task before its command and environment are known: where it runs and what it gets."""

    spec: TaskSpec
    host: Host
    role: str
    index: int
    port: int | None
    gpus: tuple[int, ...]

    @property
    def name(self) -> tuple[str, int]:
        return (self.role, self.index)


def make_plan(inventory: Inventory) -> Plan:
    """Plans every task; raises InventoryError for rules a single key cannot express."""
    file = str(inventory.path)
    slots = _place_tasks(inventory)
    _check_roles(slots, file)
    check_tf_rules(inventory.job.strategy, [s.role for s in slots], file)
    _check_failure_policy(inventory.job, slots, file)
    _check_ports(slots, file)
    check_images(inventory.job, [(s.host, s.role) for s in slots], file)
    frameworks = _check_frameworks(inventory.job, slots, file)
    cluster: dict[str, list[str]] = {}
    for s in slots:
        if s.role in CLUSTER_ROLES and not RECORDS[frameworks[s.name]].by_rank:
            cluster.setdefault(s.role, []).append(host_port(s.host.tf_address, s.port))
    cluster = {role: cluster[role] for role in CLUSTER_ROLES if role in cluster}
    shared = _Shared(
        cluster_json=json.dumps(cluster),
        placeholders={f"{r}_hosts": ",".join(cluster.get(r, [])) for r in CLUSTER_ROLES},
    )
    ranks = _ranks(slots, frameworks)
    tasks = tuple(
        _finish_task(s, inventory, shared, frameworks[s.name], ranks.get(s.name)) for s in slots
    )
    if inventory.job.profiler is not Profiler.OFF:
        tasks = _with_profiler_ports(tasks, inventory.job, file)
    if inventory.job.tensorboard is not None:
        tasks += (_tensorboard_task(inventory, tasks, file),)
    if not any(t.awaited for t in tasks):
        raise InventoryError(
            file,
            "job.role_commands",
            "every chief and worker runs the built-in server, so nothing would ever finish",
            hint="give the chief (or the workers) the training command",
        )
    return Plan(inventory=inventory, tasks=tasks, cluster=cluster)


def _tensorboard_task(inventory: Inventory, tasks: tuple[Task, ...], file: str) -> Task:
    """TensorBoard on the host of job.tensorboard.task (chief:0, else worker:0): a sidecar on
    that host's loopback, in no TF_CONFIG, stopped with the run, never awaited."""
    board = inventory.job.tensorboard
    assert board is not None
    names = {t.name: t for t in tasks}
    wanted = board.task or next(n for n in LEAD_TASKS if n in names)
    beside = names.get(wanted)
    if beside is None:
        known = ", ".join(names)
        raise InventoryError(
            file, "job.tensorboard.task", f"the job has no task {wanted} (tasks: {known})"
        )
    if any(t.port == board.port for t in tasks if t.host == beside.host):
        raise InventoryError(
            file,
            "job.tensorboard.port",
            f"{board.port} is a TF port on {beside.host}",
            hint="give TensorBoard another port (default 6006)",
        )
    if any(t.profiler_port == board.port for t in tasks if t.host == beside.host):
        raise InventoryError(
            file,
            "job.tensorboard.port",
            f"{board.port} is a profiler port on {beside.host}",
            hint="give TensorBoard another port (default 6006), or the profiler (profiler_port)",
        )
    host = next(h for h in inventory.hosts if h.name == beside.host)
    python = shlex.quote(host.python)  # the host's interpreter, which has TensorFlow
    command = (
        f"exec {python} -m tensorboard.main --logdir {shlex.quote(board.logdir)} "
        f"--port {board.port} --host 127.0.0.1"
    )
    return Task(
        role=SIDECAR.name,
        index=0,
        host=beside.host,
        address=beside.address,
        port=board.port,
        gpus=(),
        command=command,
        own_env={},
        cluster_json=beside.cluster_json,
    )


def _with_profiler_ports(tasks: tuple[Task, ...], job: Job, file: str) -> tuple[Task, ...]:
    """Each TensorFlow task its profiler port: on each host, from job.profiler_port up, one per
    TF task in plan order, none of them a TF port of that host (docs/profile.md)."""
    taken = {(t.address, t.port) for t in tasks if t.port is not None}
    next_port: dict[str, int] = {}
    out = []
    for t in tasks:
        if t.framework is not Framework.TENSORFLOW:
            out.append(t)
            continue
        port = next_port.get(t.host, job.profiler_port)
        while (t.address, port) in taken:
            port += 1
        if port > 65535:
            raise InventoryError(
                file,
                "job.profiler_port",
                f"{t.name} on host {t.host!r} would get profiler port {port}, above 65535",
                hint="give the profiler a lower first port (profiler_port = ...)",
            )
        next_port[t.host] = port + 1
        out.append(dataclasses.replace(t, profiler_port=port, profiler=job.profiler))
    return tuple(out)


def _place_tasks(inventory: Inventory) -> list[_Slot]:
    counters = dict.fromkeys(ROLE_NAMES, 0)
    slots: list[_Slot] = []
    for host in inventory.hosts:
        expanded = [spec for spec in host.tasks for _ in range(spec.count)]
        gpus = _assign_gpus(host, expanded, str(inventory.path))
        next_port = host.port
        for spec, task_gpus in zip(expanded, gpus, strict=True):
            port = None
            if has_port(spec.role):
                port, next_port = next_port, next_port + 1
            slots.append(_Slot(spec, host, spec.role, counters[spec.role], port, task_gpus))
            counters[spec.role] += 1
    return slots


def _assign_gpus(host: Host, specs: list[TaskSpec], file: str) -> list[tuple[int, ...]]:
    """Explicit lists stay; the host's other GPUs are split in contiguous blocks among the rest.

    ps tasks get no GPU unless they name one: they only hold variables.
    """
    owner: dict[int, str] = {}
    for spec in specs:
        for gpu in spec.gpus or ():
            if host.gpus and gpu >= host.gpus:
                raise InventoryError(
                    file,
                    f"{spec.key}.gpus",
                    f"GPU {gpu} does not exist: host {host.name!r} has {host.gpus} GPU(s), "
                    f"indices 0-{host.gpus - 1}",
                )
            if gpu in owner and not host.share_gpus:
                shared_with = (
                    f"the {spec.count} copies of this task"
                    if owner[gpu] == spec.key
                    else f"this task and {owner[gpu]}"
                )
                raise InventoryError(
                    file,
                    f"{spec.key}.gpus",
                    f"GPU {gpu} would be shared by {shared_with}",
                    hint=f"give each task its own GPUs, or set share_gpus = true on {host.key}",
                )
            owner[gpu] = spec.key
    free = [g for g in range(host.gpus) if g not in owner]
    implicit = [i for i, s in enumerate(specs) if s.gpus is None and role(s.role).implicit_gpus]
    result: list[tuple[int, ...]] = [s.gpus or () for s in specs]
    if implicit:
        base, extra = divmod(len(free), len(implicit))
        start = 0
        for n, i in enumerate(implicit):
            size = base + (extra if n == 0 else 0)
            result[i] = tuple(free[start : start + size])
            start += size
    if host.gpu_ids:  # the i-th GPU the scheduler granted: masks stay inside the grant
        result = [tuple(host.gpu_ids[g] for g in r if g < len(host.gpu_ids)) for r in result]
    return result


def _check_roles(slots: list[_Slot], file: str) -> None:
    for r in TF_ROLES.values():
        mine = [s for s in slots if s.role == r.name]
        if r.at_most is not None and len(mine) > r.at_most:
            raise InventoryError(
                file,
                f"{mine[r.at_most].spec.key}.role",
                f"at most {_count_word(r.at_most)} {r.name} per job, found {len(mine)}",
                hint="make the others workers",
            )
    if not any(role(s.role).awaited for s in slots):
        wanted = " or ".join(AWAITED_ROLES)
        raise InventoryError(file, "hosts", f"expected at least one task with role {wanted}")


def _count_word(n: int) -> str:
    return "one" if n == 1 else str(n)


def _check_failure_policy(job: Job, slots: list[_Slot], file: str) -> None:
    """A lone restarted MWMS worker cannot rejoin collectives in flight: TF restarts the whole
    cluster from its last checkpoint, which is what restart-job does."""
    if job.on_failure == FailurePolicy.RESTART and not any(role(s.role).serves for s in slots):
        raise InventoryError(
            file,
            "job.on_failure",
            '"restart" restarts one task, which MultiWorkerMirroredStrategy cannot take back '
            "(a job without ps tasks)",
            hint='use on_failure = "restart-job": every task is started again and resumes from '
            "its last checkpoint",
        )


def _check_ports(slots: list[_Slot], file: str) -> None:
    taken: dict[tuple[str, int], str] = {}
    for s in slots:
        if s.port is None:
            continue
        where = f"{s.role}:{s.index} on host {s.host.name!r}"
        if s.port > 65535:
            raise InventoryError(
                file, f"{s.host.key}.port", f"{where} would get port {s.port}, above 65535"
            )
        key = (s.host.tf_address, s.port)
        if key in taken:
            raise InventoryError(
                file,
                f"{s.host.key}.port",
                f"port {s.port} on {s.host.tf_address} is given to both {taken[key]} and {where}",
                hint="give one of the hosts another port range (port = ...)",
            )
        taken[key] = where


@dataclass(frozen=True)
class _Shared:
    """What every task's command and environment draw from, computed once per plan."""

    cluster_json: str
    placeholders: dict[str, str]  # {chief_hosts} etc.


def _finish_task(
    s: _Slot, inventory: Inventory, shared: _Shared, framework: Framework, rank: Rank | None
) -> Task:
    template, source = _command_template(s, inventory)
    cluster_json = shared.cluster_json
    if role(s.role).lists_only_itself:
        # Its own cluster: itself alone, at port 0 (it has no TF port; roles.py says why).
        cluster_json = json.dumps({s.role: [host_port(s.host.tf_address, 0)]})
    command = template
    if template != BUILTIN_SERVER:
        values = {"task_type": s.role, "task_index": str(s.index), **shared.placeholders}
        command = _fill(template, values, str(inventory.path), source)
    return Task(
        role=s.role,
        index=s.index,
        host=s.host.name,
        address=s.host.tf_address,
        port=s.port,
        gpus=s.gpus,
        command=command,
        own_env=_task_env(s, inventory, framework),
        cpus=s.spec.cpus,
        cluster_json=cluster_json,
        framework=framework,
        checkpoint_dir=inventory.job.checkpoint_dir,
        rank=rank,
    )


def _framework_of(job: Job, role_name: str) -> Framework:
    return job.role_frameworks.get(role_name, job.framework)


def _check_frameworks(job: Job, slots: list[_Slot], file: str) -> dict[tuple[str, int], Framework]:
    """Each slot's convention; outside TensorFlow only ranks (chief, workers) and at most one
    convention besides TensorFlow, since ranks of two conventions share no coordinator."""
    found = {s.name: _framework_of(job, s.role) for s in slots}
    for s in slots:
        if RECORDS[found[s.name]].by_rank and s.role not in RANK_ROLES:
            key = (
                "job.role_frameworks." + s.role
                if s.role in job.role_frameworks
                else "job.framework"
            )
            raise InventoryError(
                file,
                key,
                f"a {s.role} has no place among {found[s.name]}'s ranks (one process per task: "
                f"{' and '.join(RANK_ROLES)})",
                hint=f'make it a worker, or set role_frameworks.{s.role} = "tensorflow"',
            )
    others = sorted({f for f in found.values() if RECORDS[f].by_rank})
    if len(others) > 1:
        raise InventoryError(
            file,
            "job.role_frameworks",
            f"the ranks would read two conventions ({' and '.join(others)}) with no coordinator "
            "in common",
            hint="give the chief and the workers one framework",
        )
    return found


def _ranks(
    slots: list[_Slot], frameworks: dict[tuple[str, int], Framework]
) -> dict[tuple[str, int], Rank]:
    """Rank 0 the chief (else worker 0), then the workers in plan order."""
    members = [s for s in slots if RECORDS[frameworks[s.name]].by_rank]
    members.sort(key=lambda s: (RANK_ROLES.index(s.role), s.index))
    placed = ranks([(s.host.name, s.host.tf_address, s.port or 0) for s in members])
    return {s.name: r for s, r in zip(members, placed, strict=True)}


def _command_template(s: _Slot, inventory: Inventory) -> tuple[str, str]:
    job = inventory.job
    if s.spec.command:
        return s.spec.command, f"{s.spec.key}.command"
    if s.role in job.role_commands:
        return job.role_commands[s.role], f"job.role_commands.{s.role}"
    if job.command:
        return job.command, "job.command"
    raise InventoryError(
        str(inventory.path),
        s.spec.key,
        f"no command for this {s.role}",
        hint=f"set job.command, job.role_commands.{s.role} or command on this task",
    )


def _fill(template: str, values: dict[str, str], file: str, source: str) -> str:
    """Substitutes {placeholders}; anything else in braces is a mistake (write {{ }} for braces)."""
    try:
        fields = [(f, s, c) for _, f, s, c in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise InventoryError(
            file, source, f"malformed braces ({exc})", hint="write {{ and }} for literal braces"
        ) from None
    for name, spec, conversion in fields:
        if spec or conversion:
            raise InventoryError(
                file,
                source,
                f"placeholder {{{name}}} takes no format spec or conversion",
                hint="write {{ and }} for literal braces",
            )
        if name not in PLACEHOLDERS:
            raise InventoryError(
                file,
                source,
                f"unknown placeholder {{{name}}}; known: "
                + ", ".join("{" + p + "}" for p in PLACEHOLDERS),
                hint="write {{ and }} for literal braces",
            )
    return template.format_map(values)


def thread_env(threads: int | None, cpus: str | None = None) -> dict[str, str]:
    """TF's and OpenMP's thread pools for `threads = N` (gRPC's ~90 threads are not affected).

    Inter-op gets at least 2: TF_NUM_INTEROP_THREADS=1 deadlocks ParameterServerStrategy ps and
    worker servers silently (measured with TF 2.21, /work/shared/TF_NOTES.md). TF sizes that pool
    from the CPUs it may run on, so `cpus = "0"` alone makes it 1 and hangs a PSS job (measured
    on the lab with examples/digits/pss.py): pinned tasks get at least 2 as well.
    """
    if not threads:
        return {"TF_NUM_INTEROP_THREADS": str(max(2, cpu_count(cpus)))} if cpus else {}
    return {
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(max(2, threads)),
        "OMP_NUM_THREADS": str(threads),
    }


def cpu_count(cpus: str) -> int:
    """CPUs in a list such as "0-3,6" (the inventory has checked its form)."""
    count = 0
    for part in cpus.split(","):
        first, _, last = part.strip().partition("-")
        count += int(last or first) - int(first) + 1
    return count


def _reserved(inventory: Inventory, key: str, name: str) -> InventoryError:
    return InventoryError(
        str(inventory.path),
        key,
        f"{name} is set by tfdeploy for each task",
        hint=RESERVED_ENV[name],
    )


def _task_env(s: _Slot, inventory: Inventory, framework: Framework) -> dict[str, str]:
    job = inventory.job
    for source, env in (("job.env", job.env), (f"{s.spec.key}.env", s.spec.env)):
        for name in env:
            if name in RESERVED_ENV:
                raise _reserved(inventory, f"{source}.{name}", name)
            if RECORDS[framework].by_rank and name in RECORDS[framework].variables:
                raise InventoryError(
                    str(inventory.path),
                    f"{source}.{name}",
                    f"{name} is set by tfdeploy for each {framework} rank",
                    hint="remove it: the plan gives each task its rank (tfdeploy plan shows them)",
                )
    for name in job.forward_env:  # copied from this machine, then overwritten just the same
        if name in RESERVED_ENV:
            raise _reserved(inventory, "job.forward_env", name)
    return {
        **thread_env(s.spec.threads, s.spec.cpus),  # an explicit env value of that name wins
        **job.env,
        **s.spec.env,
    }
