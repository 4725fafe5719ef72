"""Preflight: ask every host for its facts and check them; nothing starts unless all pass.

It returns the plan it decided on (GPU counts of `gpus = "auto"` hosts are known only now), so
the phases after it work from one plan that never changes under them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deployer.config.model import Job, NetcheckMode
from deployer.config.plan import Plan
from deployer.config.roles import SIDECAR
from deployer.core.errors import HostError, HostsFailed
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.gpuhealth import gpu_lines
from deployer.hosts.gpurelease import prove_released
from deployer.hosts.gpus import GpuReport, check_gpus, monitored_hosts, wants_gpus
from deployer.push.sync import Manifest, scan
from deployer.up import environment, firewall, netcheck, scriptcheck
from deployer.up.images import images_by_host
from remote import protocol
from remote.protocol import HelloReply, InterpretersQuery

MIN_FREE_DISK = 100 * 1024 * 1024


def host_tensorflow(facts: Mapping[str, HelloReply]) -> list[str]:
    """The TensorFlow versions the hosts' pythons hold, for the summary line. Which task runs
    which (host python, venv, image) and whether they agree is tfrule.py's rule."""
    return sorted({f["tensorflow"] for f in facts.values() if f["tensorflow"]})


def host_problems(
    host: str, facts: HelloReply, *, python: str, job: Job, manifest: Manifest
) -> list[HostError]:
    """Busy TF ports, too little disk. (TensorFlow: tfrule.py, on every task's.)"""
    problems = []
    problems += _busy_ports(host, facts, job.name)
    free = facts["disk_free"]
    needed = MIN_FREE_DISK + 2 * manifest.total_bytes
    if free < needed:
        problems.append(
            HostError(
                host,
                f"only {free // 2**20} MiB free in {facts['workdir']}, need {needed // 2**20} MiB",
            )
        )
    return problems


def _busy_ports(host: str, facts: HelloReply, job: str) -> list[HostError]:
    busy = facts["busy_ports"]
    if not busy:
        return []
    held = facts["reserved_by"]
    # "running" (a task of that run runs on the host) or "starting" (an `up` of it is between
    # its preflight and its start); an agent older than issue 47 says neither.
    states = facts.get("reserved_state", {})
    runs = {held[str(p)]: states.get(str(p)) for p in sorted(busy) if str(p) in held}
    ports = ", ".join(str(p) for p in busy)
    if runs:
        return [_held_by(host, ports, run, state, job) for run, state in sorted(runs.items())]
    return [
        HostError(
            host,
            f"TF port(s) {ports} already in use",
            hint="stop what holds them (`tfdeploy status` lists runs) or set another port",
        )
    ]


def _held_by(host: str, ports: str, run: str, state: str | None, job: str) -> HostError:
    """The TF ports are another run's: which run, whose, and whether it runs or is starting."""
    ours = re.fullmatch(rf"{re.escape(job)}-\d{{8}}T\d{{6}}Z-[0-9a-f]{{4}}", run) is not None
    whose = "another run of this job" if ours else "a run of another job"
    down = f"`tfdeploy down {run}`"
    if state == "running":
        return HostError(
            host,
            f"TF port(s) {ports} already in use: run {run} ({whose}) is running there",
            hint=f"stop that run ({down}) or give this job another port (job.port)",
        )
    if state == "starting":
        # The host knows only that an `up` reserved them and started no task of that run
        # there: that `up` may be pushing or installing still, or it died without releasing
        # them (SIGKILL, a lost link). Both are said; the reservation lapses with its lease.
        return HostError(
            host,
            f"TF port(s) {ports} already in use: reserved by run {run} ({whose}), whose `up` "
            "has started no task there: it is still preparing the run, or it ended without "
            "releasing them (the reservation then lapses within that run's lease_seconds, "
            f"{protocol.DEFAULT_RESERVATION_S:g} s by default)",
            hint=f"wait for that `up`, or stop that run ({down}: it frees them at once)",
        )
    return HostError(
        host,
        f"TF port(s) {ports} already in use: reserved by run {run} ({whose})",
        hint=f"`tfdeploy status` says whether it runs; stop it ({down}) or give this job "
        "another port (job.port)",
    )


@dataclass(frozen=True)
class Findings:
    """What preflight found: the plan to run, the code to push, and what to tell the user."""

    plan: Plan
    manifest: Manifest
    gpu_hosts: frozenset[str]  # hosts whose GPU use the live view shows
    gpu_reports: Mapping[str, GpuReport]
    warnings: tuple[str, ...]
    summary: str  # "python 3.11.2, tensorflow 2.21.0"
    gpu_lines: tuple[str, ...] = ()  # every GPU host's GPUs and their health, for `check`
    # Hosts that see one workdir (an NFS home), in plan order; a host alone is a group of one.
    # The push sends each content to the first host of a group only.
    workdir_groups: tuple[tuple[str, ...], ...] = ()
    # Hosts whose store holds nothing yet: they lack every content, and the push knows it
    # without asking them.
    empty_stores: frozenset[str] = frozenset()
    # Each host's hello facts (its Python, machine and glibc: what its environment resolves for).
    facts: Mapping[str, HelloReply] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """The run preflight reserves the TF ports for, and how long a silent controller keeps them."""

    run_id: str
    lease_seconds: float
    # `up --resume`: the run's folder is on every host, ended; each hello checks it can be
    # resumed, lifts its stop and answers its last `attempt` (remote/resume.py).
    resume: bool = False


def preflight(
    plan: Plan,
    fleet: Fleet,
    claim: Claim,
    *,
    forwarded: Sequence[str] = (),
    network: NetcheckMode | None = None,
    keep_stand_ins: bool = False,
) -> Findings:
    """Hello to every host in parallel, then every check; raises HostsFailed naming them all.

    The hello reserves each host's TF ports for `claim.run_id`; if any check fails they are
    released again, since nothing of the run will start. Last, the TF connections between hosts
    are tried as `network` says (None: as the job's `netcheck` says; netcheck.py).
    `keep_stand_ins`: the caller releases the run next, which stops the check's listeners.
    """
    members = [fleet.member(h.name) for h in plan.hosts]
    scanning = _Scan(plan.job.code)
    mode = network or plan.job.netcheck
    listens = netcheck.listeners(plan, mode) if mode is not NetcheckMode.OFF else {}
    greeted = _Greeted(claim, listens)
    # Hosts whose tasks run in a venv or an image: their TensorFlow is not the host python's.
    greeted.in_venv = environment.uses_requirements(plan) | frozenset(images_by_host(plan))
    try:
        findings = _conclude(plan, fleet, greeted, members, scanning, forwarded)
        scriptcheck.refuse_missing_scripts(findings.plan)  # a script `code` lacks: nothing starts
        if mode is not NetcheckMode.OFF:
            tried = netcheck.check(
                fleet,
                findings.plan,
                claim.run_id,
                mode,
                listening=greeted.listening,
                close=not keep_stand_ins,
            )
            if tried:
                summary = f"{findings.summary}; {tried.summary()}"
                findings = dataclasses.replace(findings, summary=summary)
        return findings
    except BaseException as exc:
        # Only hosts that answered: an unreachable one would make Ctrl-C wait for its timeout.
        # `release` also stops the stand-ins a hello started.
        holders = [m for m in members if m.name in greeted.claimed]
        fleet.each_settled(
            lambda m: _release(m, claim.run_id),
            holders,
            urgent=isinstance(exc, KeyboardInterrupt),
        )
        raise


def _release(member: Member, run_id: str) -> None:
    """The hello's reservation dropped on a host that answered. After a reply the edge
    refused, the host's session still serves it; without that session and an agent directory
    there is no way to ask, and the reservation lapses with its lease."""
    with contextlib.suppress(RuntimeError):  # no agent directory known: the reply named none
        member.agent.release(run_id)


class _Scan:
    """The code directory hashed while the hosts are greeted: hashing (hashlib lets go of the
    GIL) and waiting on the network overlap, so a first push of a large code directory starts
    that much sooner. A daemon thread: Ctrl-C does not wait for a scan of gigabytes."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._manifest: Manifest | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="scan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._manifest = scan(self._root)
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> Manifest:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._manifest is not None
        return self._manifest


class _Greeted:
    """What the hellos asked for and did: the claim, the network check's stand-ins each host
    is to start, and which hosts answered (they may hold a reservation) or listen now."""

    def __init__(
        self,
        claim: Claim,
        listens: Mapping[str, netcheck.Listen],
    ) -> None:
        self.claim = claim
        self.listens = listens
        self.claimed: set[str] = set()
        self.in_venv: frozenset[str] = frozenset()  # hosts whose tasks run in a job's venv
        self._listening: dict[str, tuple[netcheck.Listen, float]] = {}  # and since when

    def listened(self, host: str, listen: netcheck.Listen) -> None:
        self._listening[host] = (listen, time.monotonic())

    @property
    def listening(self) -> dict[str, netcheck.Listen]:
        """The stand-ins that still have their probe budget ahead: each lives its budget plus
        netcheck.LISTEN_S from its hello, and a long preflight (a large code directory to
        hash) may have used up part of that margin; `check` starts the others anew."""
        fresh = time.monotonic() - netcheck.LISTEN_S / 2
        return {h: listen for h, (listen, at) in self._listening.items() if at > fresh}


def _conclude(
    plan: Plan,
    fleet: Fleet,
    greeted: _Greeted,
    members: list[Member],
    scanning: _Scan,
    forwarded: Sequence[str],
) -> Findings:
    hellos = fleet.each(lambda m: _hello(plan, m, greeted), members, what="preflight failed")
    facts = {name: hello for name, (hello, _) in hellos.items()}
    reports = {name: gpus for name, (_, gpus) in hellos.items() if gpus is not None}
    manifest = scanning.result()
    # The summary's TensorFlow: the hosts' pythons where no venv or image stands in between.
    tf_versions = host_tensorflow({n: f for n, f in facts.items() if n not in greeted.in_venv})
    problems = [
        problem
        for name, f in facts.items()
        for problem in host_problems(
            name, f, python=fleet.member(name).agent.python, job=plan.job, manifest=manifest
        )
    ]
    interpreters: list[str] = []
    for name, f in facts.items():
        answer = f.get("interpreters")
        if answer is not None:  # hosts without requirements: the hello answered it
            found, said = environment.interpreter_problems(
                name, answer, fleet.member(name).agent.python
            )
            problems += found
            interpreters += said
    final_plan, gpu_problems, warnings = check_gpus(plan, reports)
    warnings = [*final_plan.warnings, *warnings]  # TF's rules, on the counts `gpus = "auto"` learnt
    problems += gpu_problems
    # An earlier attempt of this run (a restart, a replaced host) may still be letting go of
    # its GPUs: wait for it as teardown does, rather than refuse it as another's.
    earlier = [fleet.member(n) for n, r in reports.items() if any(a.run for a in r.apps)]
    problems += prove_released(fleet, earlier, greeted.claim.run_id) if earlier else []
    if plan.job.firewall:
        problems += firewall.check(fleet, members)
    problems += _tensorboard_missing(plan, fleet)
    if problems:
        raise HostsFailed(problems)
    warnings += interpreters
    missing = sorted(set(plan.job.forward_env) - set(forwarded))
    if missing:
        warnings.append(f"forward_env: {', '.join(missing)} are not set here")
    python = sorted({f["python"] for f in facts.values()})
    return Findings(
        plan=final_plan,
        manifest=manifest,
        gpu_hosts=frozenset(monitored_hosts(final_plan, reports)),
        gpu_reports=reports,
        warnings=tuple(warnings),
        gpu_lines=tuple(gpu_lines(final_plan, reports)),
        summary=f"python {'/'.join(python)}, {_tensorflow_words(final_plan, tf_versions)}",
        workdir_groups=shared_workdirs([m.name for m in members], facts),
        empty_stores=frozenset(name for name, f in facts.items() if f["store_empty"]),
        facts=facts,
    )


def _tensorboard_missing(plan: Plan, fleet: Fleet) -> list[HostError]:
    """[job.tensorboard] needs the package where it runs, unless job.setup may install it."""
    sidecar = next((t for t in plan.tasks if t.role == SIDECAR.name), None)
    if sidecar is None or plan.job.setup:
        return []
    agent = fleet.member(sidecar.host).agent
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('tensorboard') else 3)"
    if agent.transport.run([agent.python, "-c", probe], timeout=60).exit_code == 0:
        return []
    return [
        HostError(
            sidecar.host,
            f"TensorBoard is not installed for {agent.python} ([job.tensorboard] runs it here)",
            hint="pip install tensorboard on the host, add it to job.setup, or drop "
            "[job.tensorboard]",
        )
    ]


def shared_workdirs(
    hosts: Sequence[str], facts: Mapping[str, HelloReply]
) -> tuple[tuple[str, ...], ...]:
    """Group hosts by the workdir they see, from each hello's `host_id` and `shared_with`.

    Two hosts share when either lists the other (of two hellos at one instant only the later is
    sure to see the other's token) or they report the same id (one machine, e.g. loopback).
    """
    ids = {h: facts[h]["host_id"] for h in hosts}
    group = {h: h for h in hosts}  # union-find: each host's representative

    def root(h: str) -> str:
        while group[h] != h:
            h = group[h]
        return h

    by_id: dict[str, str] = {}
    for h in hosts:
        if not ids[h]:
            continue  # an agent without host ids: keep it on its own
        if ids[h] in by_id:
            group[root(h)] = root(by_id[ids[h]])
        by_id.setdefault(ids[h], h)
    for h in hosts:
        for other_id in facts[h]["shared_with"]:
            if other_id in by_id:
                group[root(by_id[other_id])] = root(h)
    groups: dict[str, list[str]] = {}
    for h in hosts:
        groups.setdefault(root(h), []).append(h)
    return tuple(tuple(g) for g in groups.values())


def _hello(plan: Plan, member: Member, greeted: _Greeted) -> tuple[HelloReply, GpuReport | None]:
    """The host's hello, and its GPUs where its tasks use them."""
    tasks = plan.tasks_on(member.name)
    # TF ports and profiler ports: free, and reserved for the run until its tasks bind them.
    ports = [p for t in tasks for p in (t.port, t.profiler_port) if p is not None]
    claim, listen = greeted.claim, greeted.listens.get(member.name)
    words = environment.python_words(plan.tasks_on(member.name))
    asked: InterpretersQuery | None = None
    if words and member.name not in greeted.in_venv:
        asked = {"python": member.agent.python, "words": words}  # else the env op answers
    try:
        facts = member.agent.install(
            ports,
            run_id=claim.run_id,
            lease_seconds=claim.lease_seconds,
            listen=(listen.ports, listen.seconds) if listen is not None else None,
            interpreters=asked,
            job=plan.job.name,
            resume=claim.resume,
        )
    finally:
        # A host that answered holds the hello's reservation, even when the edge refused
        # its reply (a malformed field): the failure path releases it (one set.add per
        # thread: safe under the GIL).
        if member.agent.replied:
            greeted.claimed.add(member.name)
    if listen is not None and facts.get("listening"):
        greeted.listened(member.name, listen)
    gpus = GpuReport.from_json(member.agent.gpus(claim.run_id)) if wants_gpus(member.host) else None
    return facts, gpus


def _tensorflow_words(plan: Plan, versions: Sequence[str]) -> str:
    """'tensorflow 2.21.0'; where the hosts have none, where the tasks' TensorFlow comes from
    (the job's requirements or image), not a bare '-' that reads as "missing"."""
    if versions:
        return f"tensorflow {'/'.join(versions)}"
    if environment.uses_requirements(plan) or images_by_host(plan):
        return "tensorflow: from the job's environment"
    if plan.job.setup:
        return "tensorflow: from the job's setup commands"
    return "tensorflow: none on the hosts (job.require_tensorflow = false)"
