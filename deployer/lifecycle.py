"""One `up`: preflight every host, push, set up, start in TF's order, watch, and always tear down.

Whatever ends the job (success, a failed task, a missed deadline, Ctrl-C, an error of tfdeploy's
own), every task that was started is stopped before `up` returns, unless the user asked to detach.
"""

from __future__ import annotations

import os
import shlex
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deployer import firewall
from deployer.agent import Poll, TaskStatus
from deployer.errors import HostError, HostsFailed, Interrupted, JobFailed
from deployer.fleet import Fleet, Member
from deployer.gpus import (
    GpuMonitor,
    GpuReport,
    check_gpus,
    gpu_reports,
    monitored_hosts,
    wants_gpus,
)
from deployer.lines import LineAssembler
from deployer.plan import Plan, Task
from deployer.secrets import mask_text
from deployer.state import RunRecord, new_run_id, save
from deployer.sync import Manifest, PushResult, push, scan, setup_fingerprint
from deployer.view import TaskRow, View

MIN_FREE_DISK = 100 * 1024 * 1024
TAIL_LINES = 20


@dataclass(frozen=True)
class UpOptions:
    detach: bool = False
    poll_interval: float = 0.25
    lease_seconds: float | None = 60.0  # a controller silent this long makes hosts stop the run


@dataclass
class _TaskWatch:
    """What the controller knows of one task while the job runs."""

    task: Task
    offset: int = 0
    status: TaskStatus | None = None
    lines: LineAssembler = field(default_factory=LineAssembler)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def label(self) -> str:
        return f"{self.task.name}@{self.task.host}"


def server_like(task: Task) -> bool:
    """Tasks that must be serving before anyone else starts (TF clients block on them)."""
    return task.is_server or task.role == "ps"


def start_groups(plan: Plan) -> list[list[Task]]:
    """ps and servers first, then workers, then the chief and evaluators."""
    servers = [t for t in plan.tasks if server_like(t)]
    workers = [t for t in plan.tasks if t.role == "worker" and not server_like(t)]
    last = [t for t in plan.tasks if t.role in ("chief", "evaluator") and not server_like(t)]
    return [group for group in (servers, workers, last) if group]


class Deployment:
    """Carries one run from plan to teardown; `run` returns the exit status."""

    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        view: View,
        options: UpOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.fleet = fleet
        self.view = view
        self.options = options
        self.clock = clock
        self.sleep = sleep
        self.run_id = new_run_id(plan.job.name)
        self.watches = {t.name: _TaskWatch(t) for t in plan.tasks}
        self.started_hosts: set[str] = set()  # hosts where start was attempted: teardown's list
        self._torn_down = False
        self.push_results: dict[str, PushResult] = {}
        self.firewalled: list[str] = []  # hosts that may hold this run's firewall rules
        self.members = [fleet.member(h.name) for h in plan.hosts]
        self.gpu_monitor = GpuMonitor(set(), clock=clock)
        environ = os.environ if environ is None else environ
        # job.forward_env: only the names listed there, never the controller's env implicitly.
        self.forwarded = {n: environ[n] for n in plan.job.forward_env if n in environ}

    # ---- phases -------------------------------------------------------------------------

    def run(self) -> int:
        try:
            manifest = self.preflight()
            self.push(manifest)
            self.setup(manifest)
            self.firewall_up()
            self.start()
            if self.options.detach:
                self.view.step(
                    f"run {self.run_id} is running detached; stop it with "
                    f"`tfdeploy down {self.run_id}`"
                )
                return 0
            self.watch()
            return 0
        except KeyboardInterrupt:
            self.view.step("interrupted: stopping every task that was started")
            self.teardown()
            raise Interrupted(f"interrupted; run {self.run_id} was stopped") from None
        except BaseException:
            self.teardown()
            raise
        finally:
            self.view.close()

    def preflight(self) -> Manifest:
        hosts = ", ".join(m.name for m in self.members)
        self.view.step(f"preflight of {len(self.members)} host(s): {hosts}")
        manifest = scan(self.plan.job.code)
        facts = self.fleet.each(self._hello, self.members, what="preflight failed")
        versions = {name: f.get("tensorflow") for name, f in facts.items()}
        known = {v for v in versions.values() if v}
        if len(known) > 1:
            raise HostsFailed(
                [HostError(n, f"TensorFlow {v or 'missing'}") for n, v in sorted(versions.items())],
                what="hosts disagree on the TensorFlow version",
            )
        problems = [p for name, f in facts.items() for p in self._check_facts(name, f, manifest)]
        problems += self._check_gpus(facts)
        if self.plan.job.firewall:
            problems += firewall.check(self.fleet, self.members)
        if problems:
            raise HostsFailed(problems)
        python = sorted({str(f.get("python")) for f in facts.values()})
        tf_versions = sorted(str(v) for v in known)
        self.view.step(
            f"preflight ok: python {'/'.join(python)}, tensorflow {'/'.join(tf_versions) or '-'}"
        )
        return manifest

    def _hello(self, member: Member) -> dict[str, object]:
        ports = [t.port for t in self.plan.tasks_on(member.name) if t.port is not None]
        facts = member.agent.install(ports)
        if wants_gpus(member.host):
            facts["gpus"] = member.agent.call("gpus")
        return facts

    def _check_gpus(self, facts: dict[str, dict[str, object]]) -> list[HostError]:
        """Re-plans with the GPUs the hosts reported (gpus = "auto") and checks requested ones."""
        reports = gpu_reports(facts)
        self.plan, problems, warnings = check_gpus(self.plan, reports)
        for warning in warnings:
            self.view.step(f"warning: {warning}")
        self.watches = {t.name: _TaskWatch(t) for t in self.plan.tasks}
        self.gpu_monitor.hosts = monitored_hosts(self.plan, reports)
        missing = sorted(set(self.plan.job.forward_env) - set(self.forwarded))
        if missing:
            self.view.step(f"warning: forward_env: {', '.join(missing)} are not set here")
        return problems

    def _check_facts(
        self, host: str, facts: dict[str, object], manifest: Manifest
    ) -> list[HostError]:
        problems = []
        busy = facts.get("busy_ports") or []
        if busy:
            ports = ", ".join(str(p) for p in busy)  # type: ignore[attr-defined]
            problems.append(
                HostError(
                    host,
                    f"TF port(s) {ports} already in use",
                    hint="stop what holds them (`tfdeploy status` lists runs) or set another port",
                )
            )
        if not facts.get("tensorflow") and not self.plan.job.setup:
            problems.append(
                HostError(
                    host,
                    f"TensorFlow is not installed for {self.fleet.member(host).agent.python}",
                    hint="install tensorflow on the host or add it to job.setup",
                )
            )
        free = int(facts.get("disk_free") or 0)  # type: ignore[call-overload]
        needed = MIN_FREE_DISK + 2 * manifest.total_bytes
        if free < needed:
            problems.append(
                HostError(
                    host,
                    f"only {free // 2**20} MiB free in {facts.get('workdir')}, "
                    f"need {needed // 2**20} MiB",
                )
            )
        return problems

    def push(self, manifest: Manifest) -> None:
        self._save_record()
        fields = {
            "run_id": self.run_id,
            "job": self.plan.job.name,
            "detached": self.options.detach,
            "lease_seconds": None if self.options.detach else self.options.lease_seconds,
            "controller": _controller_name(),
        }
        self.push_results = self.fleet.each(
            lambda m: push(m.agent, manifest, fields), self.members, what="pushing the code failed"
        )
        sent = sum(r.sent_bytes for r in self.push_results.values())
        sent_files = sum(r.sent_files for r in self.push_results.values())
        self.view.step(
            f"pushed {len(manifest.files)} files to {len(self.members)} host(s): "
            f"{sent_files} file(s), {sent} bytes sent (run {self.run_id})"
        )

    def setup(self, manifest: Manifest) -> None:
        job = self.plan.job
        if not job.setup:
            return
        fingerprint = setup_fingerprint(job.setup, job.env, manifest)
        self.view.step(f"setup ({len(job.setup)} command(s)) on {len(self.members)} host(s)")

        def run_setup(member: Member) -> bool:
            reply = member.agent.call(
                "setup",
                timeout=3600,
                run_id=self.run_id,
                commands=list(job.setup),
                env=job.env,
                fingerprint=fingerprint,
            )
            if reply.get("code"):
                tail = "\n    ".join(reply.get("tail") or [])
                message = f"setup failed (exit code {reply['code']}):\n    {tail}"
                raise HostError(member.name, mask_text(message, job.env, job.secret_env))
            return bool(reply.get("ran"))

        ran = self.fleet.each(run_setup, self.members, what="setup failed")
        skipped = [n for n, r in ran.items() if not r]
        if skipped:
            self.view.step(f"setup unchanged, skipped on {', '.join(skipped)}")

    def firewall_up(self) -> None:
        """With job.firewall: TF ports accept only the cluster's addresses, before any start."""
        if not self.plan.job.firewall:
            return
        self.firewalled = [m.name for m in self.members]  # a partial add is cleaned up too
        firewall.add(self.fleet, self.members, self.plan, self.run_id)
        self.view.step(
            f"firewall: TF ports accept only {', '.join(firewall.allowed_addresses(self.plan))}"
        )

    def firewall_down(self) -> None:
        members = [self.fleet.member(h) for h in self.firewalled]
        self.firewalled = []
        for failure in firewall.remove(self.fleet, members, self.run_id):
            self.view.step(f"could not remove the firewall rules on {failure.message}")

    def start(self) -> None:
        deadline = self.clock() + self.plan.job.start_timeout
        for group in start_groups(self.plan):
            self._start_group(group)
            servers = [t for t in group if server_like(t) and t.port is not None]
            if servers:
                self._wait_listening(servers, deadline)
        self.view.step(f"all {len(self.plan.tasks)} task(s) started")

    def _start_group(self, tasks: list[Task]) -> None:
        by_host: dict[str, list[Task]] = {}
        for task in tasks:
            by_host.setdefault(task.host, []).append(task)
        members = [self.fleet.member(h) for h in by_host]
        self.started_hosts.update(by_host)
        names = ", ".join(t.name for t in tasks)
        self.view.step(f"starting {names}")

        def start_on(member: Member) -> list[TaskStatus]:
            payload = [self._start_payload(member, t) for t in by_host[member.name]]
            return member.agent.start(self.run_id, payload, self.plan.job.stop_grace)

        for statuses in self.fleet.each(start_on, members, what="starting tasks failed").values():
            self._update(statuses)

    def _start_payload(self, member: Member, task: Task) -> dict[str, object]:
        command = task.command
        if task.is_server:
            server = f"{member.agent.agent_dir}/tfserver.py"
            command = f"exec {shlex.quote(member.agent.python)} {shlex.quote(server)}"
        return {
            "name": task.name,
            "command": command,
            "env": {**self.forwarded, **task.env, "TFDEPLOY_RUN_ID": self.run_id},
        }

    def _wait_listening(self, servers: list[Task], deadline: float) -> None:
        waiting = {t.name for t in servers}
        while waiting:
            polls = self._poll_all()
            for poll in polls.values():
                for status in poll.tasks:
                    if status.name in waiting and status.finished:
                        raise self._failure(status.name, "stopped before it served its port")
            for host, poll in polls.items():
                waiting -= {t.name for t in self.plan.tasks_on(host) if t.port in poll.listening}
            if waiting and self.clock() > deadline:
                late = ", ".join(sorted(waiting))
                raise JobFailed(
                    f"{late} did not accept connections on its TF port within "
                    f"{self.plan.job.start_timeout:g} s (start_timeout)",
                    hint="check its log with `tfdeploy logs`, or raise job.start_timeout",
                )
            if waiting:
                self.sleep(self.options.poll_interval)

    def watch(self) -> None:
        """Streams logs until every awaited task has exited; fails fast on the first failure."""
        awaited = [t.name for t in self.plan.tasks if t.awaited]
        self.view.step(f"watching; the job ends when {', '.join(awaited)} exit")
        while True:
            self._poll_all()
            failed = self._first_failure(awaited)
            if failed:
                raise self._failure(failed, "failed")
            if all(self._finished(n) for n in awaited):
                break
            self.sleep(self.options.poll_interval)
        self._grace_for_evaluators()
        self.view.step(f"job succeeded: {', '.join(awaited)} exited 0; stopping the rest")
        self.teardown()

    def _grace_for_evaluators(self) -> None:
        evaluators = [t.name for t in self.plan.tasks if t.role == "evaluator"]
        if not evaluators:
            return
        grace = self.plan.job.evaluator_grace
        self.view.step(f"waiting up to {grace:g} s for evaluators to finish")
        deadline = self.clock() + grace
        while self.clock() < deadline and not all(self._finished(n) for n in evaluators):
            self.sleep(self.options.poll_interval)
            self._poll_all()

    def teardown(self) -> None:
        """Stops every task of the run on every host it started on; reports what it could not."""
        members = [self.fleet.member(h) for h in sorted(self.started_hosts)]
        if not members or self._torn_down:
            self.firewall_down()
            return
        self._torn_down = True
        grace = self.plan.job.stop_grace
        try:
            _, failures = self.fleet.each_settled(
                lambda m: m.agent.stop(self.run_id, grace=grace), members
            )
        except KeyboardInterrupt:  # a second Ctrl-C: no more grace
            _, failures = self.fleet.each_settled(
                lambda m: m.agent.stop(self.run_id, grace=0), members
            )
        for failure in failures:
            self.view.step(f"could not stop the run on {failure.message}")
        self._poll_all(heartbeat=False, tolerate=True)
        self.firewall_down()

    # ---- watching helpers -------------------------------------------------------------

    def _poll_all(self, *, heartbeat: bool = True, tolerate: bool = False) -> dict[str, Poll]:
        members = [self.fleet.member(h) for h in sorted(self.started_hosts)]

        def poll_one(member: Member) -> Poll:
            offsets = {
                w.task.name: w.offset
                for w in self.watches.values()
                if w.task.host == member.name and w.status is not None
            }
            ports = [t.port for t in self.plan.tasks_on(member.name) if t.port is not None]
            return member.agent.poll(self.run_id, offsets, ports=ports, heartbeat=heartbeat)

        polls, failures = self.fleet.each_settled(poll_one, members)
        if failures and not tolerate:
            lost = failures[0]
            raise JobFailed(
                f"lost contact with host {lost.host}: {lost.cause}",
                hint="the other hosts were stopped; check the host and its network",
            )
        for poll in polls.values():
            self._update(poll.tasks)
            for name, (offset, data) in poll.logs.items():
                self._feed(name, offset, data)
        if self.gpu_monitor.due():
            gpu_members = [self.fleet.member(h) for h in sorted(self.gpu_monitor.hosts)]
            replies, _ = self.fleet.each_settled(lambda m: m.agent.call("gpus"), gpu_members)
            self.gpu_monitor.update({n: GpuReport.from_json(r) for n, r in replies.items()})
        self._show_rows()
        return polls

    def _feed(self, name: str, offset: int, data: bytes) -> None:
        watch = self.watches[name]
        watch.offset = offset
        lines = watch.lines.feed(data)
        if watch.status is not None and watch.status.finished and offset >= watch.status.log_bytes:
            lines += watch.lines.flush()
        if lines:
            watch.tail.extend(lines)
            self.view.lines(watch.label, lines)

    def _update(self, statuses: Sequence[TaskStatus]) -> None:
        for status in statuses:
            if status.name in self.watches:
                self.watches[status.name].status = status

    def _show_rows(self) -> None:
        rows = []
        for w in self.watches.values():
            s = w.status
            rows.append(
                TaskRow(
                    name=w.task.name,
                    host=w.task.host,
                    state=s.state if s else "pending",
                    pid=s.pid if s else None,
                    gpus=",".join(map(str, w.task.gpus)) or "-",
                    gpu_use=self.gpu_monitor.usage(w.task),
                    started=s.started if s else None,
                    ended=s.ended if s else None,
                    outcome=s.outcome() if s and s.finished else "",
                    last_line=w.tail[-1] if w.tail else "",
                )
            )
        self.view.tasks(rows)

    def _finished(self, name: str) -> bool:
        status = self.watches[name].status
        return status is not None and status.finished

    def _first_failure(self, awaited: list[str]) -> str | None:
        failed = [
            w
            for w in self.watches.values()
            if w.status is not None
            and w.status.finished
            and not w.status.succeeded
            and (w.task.name in awaited or server_like(w.task))
        ]
        failed.sort(key=lambda w: (w.status.ended or 0.0) if w.status else 0.0)
        return failed[0].task.name if failed else None

    def _failure(self, name: str, what: str) -> JobFailed:
        watch = self.watches[name]
        self._poll_all(heartbeat=True, tolerate=True)  # drain the last log lines of the task
        outcome = watch.status.outcome() if watch.status else "unknown"
        tail = "\n".join(f"    {line}" for line in watch.tail) or "    (no output)"
        job = self.plan.job
        message = f"{watch.label} {what} ({outcome}); its last {len(watch.tail)} log lines:\n{tail}"
        return JobFailed(
            mask_text(message, watch.task.env, job.secret_env),
            hint=f"the other tasks were stopped; full log: tfdeploy logs {self.run_id} "
            f"--task {name}",
        )

    def _save_record(self) -> None:
        save(
            RunRecord(
                run_id=self.run_id,
                inventory=str(self.plan.inventory.path.resolve()),
                job=self.plan.job.name,
                created=time.time(),
                detached=self.options.detach,
            )
        )


def _controller_name() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return socket.gethostname()
