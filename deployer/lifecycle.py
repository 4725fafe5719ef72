"""One `up`: preflight every host, push, set up, start in TF's order, watch, and always tear down.

Whatever ends the job (success, a failed task, a missed deadline, Ctrl-C, an error of tfdeploy's
own), every task that was started is stopped before `up` returns, unless the user asked to detach.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deployer import firewall
from deployer.agent import Poll, TaskStatus
from deployer.errors import HostError, HostsFailed, Interrupted, JobFailed
from deployer.fleet import Fleet, Member, Pending
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
# A host is declared lost when no poll has succeeded for this long. Shorter outages (a reset
# connection that is re-opened, a slow reply under load) are retried every poll tick. A crashed
# host refuses connections at once, a cut link leaves its poll unanswered; either way the window
# runs from the last good contact, so both are seen within HOST_LOSS_S + a tick (< 10 s), never
# after the kernel's ~15-minute retransmission timeout.
HOST_LOSS_S = 6.0
# A poll is one short agent call; one that takes longer is a failed contact (and is retried).
POLL_TIMEOUT_S = 8.0
POLL_WAIT_S = 1.0  # how long one tick waits for slow hosts before going on without them
TOLERANT_WAIT_S = 2.0  # final reads (teardown, failure reports) wait this long for stragglers


@dataclass(frozen=True)
class UpOptions:
    detach: bool = False
    poll_interval: float = 0.25
    # A controller silent this long makes hosts stop the run; None: the inventory's
    # job.lease_seconds (default 60).
    lease_seconds: float | None = None


@dataclass
class _TaskWatch:
    """What the controller knows of one task while the job runs."""

    task: Task
    offset: int = 0
    status: TaskStatus | None = None
    lines: LineAssembler = field(default_factory=LineAssembler)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    restarts: int = 0  # restarts decided by this controller (failure policy "restart")
    mark: tuple[object, ...] = ()  # (log bytes, state, restarts) at the last observed change
    active_at: float = 0.0  # controller clock at that change: the stall watchdog's input

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
        self.started_hosts: set[str] = set()  # hosts where start was attempted: polled
        self.contacted_hosts: set[str] = set()  # hosts that may hold the run: teardown's list
        self.last_contact: dict[str, float] = {}  # host -> clock of its last successful poll
        self.lost: dict[str, str] = {}  # host -> why it was declared lost
        self._outages: set[str] = set()  # hosts whose last poll failed, not yet lost
        self._inflight: dict[str, Pending[Poll]] = {}  # host -> its poll still running
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
            self.view.step(
                "interrupted: stopping every task that was started (Ctrl-C again to kill at once)"
            )
            self.fleet.interrupt()  # abandon calls in flight (a push) so the stop is not queued
            self._inflight.clear()
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
        # From here on a host may hold the run (and soon its setup processes): teardown asks them.
        self.contacted_hosts.update(m.name for m in self.members)
        lease = self.options.lease_seconds or self.plan.job.lease_seconds
        fields = {
            "run_id": self.run_id,
            "job": self.plan.job.name,
            "detached": self.options.detach,
            "lease_seconds": None if self.options.detach else lease,
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
            statuses = member.agent.start(self.run_id, payload, self.plan.job.stop_grace)
            self.last_contact[member.name] = self.clock()
            return statuses

        results, failures = self.fleet.each_settled(start_on, members)
        for statuses in results.values():
            self._update(statuses)
        if failures:
            # Others may have started: the caller's teardown stops them before `up` exits.
            lines = "\n".join(f"  {f.message}" for f in failures)
            raise JobFailed(
                f"starting {names} failed on {len(failures)} host(s):\n{lines}",
                hint="every task started so far was stopped; fix the host and run up again",
            )

    def _start_payload(self, member: Member, task: Task) -> dict[str, object]:
        command = task.command
        if task.is_server:
            server = f"{member.agent.agent_dir}/tfserver.py"
            command = f"exec {shlex.quote(member.agent.python)} {shlex.quote(server)}"
        payload: dict[str, object] = {
            "name": task.name,
            "command": command,
            "env": {**self.forwarded, **task.env, "TFDEPLOY_RUN_ID": self.run_id},
        }
        if task.cpus is not None:
            payload["cpus"] = task.cpus  # the supervisor pins the task before exec
        return payload

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
        began = self.clock()
        for w in self.watches.values():  # the stall clock starts now, not at the tasks' start
            w.active_at = max(w.active_at, began)
        while True:
            self._poll_all()
            failed = self._first_failure(awaited)
            if failed and self._may_restart(failed):
                self._restart(failed)
                continue
            if failed:
                restarts = self.watches[failed].restarts
                after = f" after {restarts} restart(s)" if restarts else ""
                raise self._failure(failed, f"failed{after}")
            if all(self._finished(n) for n in awaited):
                break
            self._check_stall(awaited)
            if not self._behind():  # a backlog is read at once: waiting only adds latency
                self.sleep(self.options.poll_interval)
        self._drain()
        self._grace_for_evaluators()
        self.view.step(f"job succeeded: {', '.join(awaited)} exited 0; stopping the rest")
        self.teardown()

    def _behind(self) -> bool:
        """Some task's log holds more than the last poll could carry (max_bytes per host)."""
        return any(
            w.status is not None and w.offset < w.status.log_bytes for w in self.watches.values()
        )

    def _drain(self) -> None:
        """Reads what finished tasks wrote after the last poll: every line is shown, even a
        backlog larger than one poll carries."""
        while self._behind():
            before = sum(w.offset for w in self.watches.values())
            self._poll_all()
            if sum(w.offset for w in self.watches.values()) == before:
                return  # no progress (a log shrank or vanished): nothing more to show

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
        """Stops the run on every host that may hold it; reports what it could not.

        The stop also ends a setup command still running (Ctrl-C during setup). A host already
        declared lost is not waited for: its supervisors stop its tasks when the lease lapses.
        """
        hosts = sorted((self.contacted_hosts | self.started_hosts) - set(self.lost))
        members = [self.fleet.member(h) for h in hosts]
        if not members or self._torn_down:
            self.firewall_down()
            return
        self._torn_down = True
        for host in sorted(self.lost):
            self.view.step(
                f"host {host} was lost: its tasks stop by themselves once the controller's "
                f"lease lapses ({self._lease():g} s without a heartbeat)"
            )
        grace = self.plan.job.stop_grace
        try:
            _, failures = self.fleet.each_settled(
                lambda m: m.agent.stop(self.run_id, grace=grace), members
            )
        except KeyboardInterrupt:  # a second Ctrl-C: no more grace
            self.view.step("second Ctrl-C: killing every task now (SIGKILL)")
            # Fresh threads: the graceful stops still hold the fleet's usual slots.
            _, failures = self.fleet.each_settled(
                lambda m: m.agent.stop(self.run_id, grace=0), members, urgent=True
            )
        for failure in failures:
            self.view.step(f"could not stop the run on {failure.message}")
        with contextlib.suppress(KeyboardInterrupt):  # only the final states are left to read
            self._poll_all(heartbeat=False, tolerate=True)
        self.firewall_down()

    def _lease(self) -> float:
        return self.options.lease_seconds or self.plan.job.lease_seconds

    # ---- failure policy and stall watchdog ----------------------------------------------

    def _may_restart(self, name: str) -> bool:
        """Policy "restart": a failed worker or ps is started again, at most max_restarts times."""
        watch, job = self.watches[name], self.plan.job
        status = watch.status
        return (
            job.on_failure == "restart"
            and watch.task.role in ("worker", "ps")
            and watch.restarts < job.max_restarts
            and status is not None
            and status.reason not in ("stopped", "lease expired")
        )

    def _restart(self, name: str) -> None:
        """Same command, same TF_CONFIG, same host and port: PSS picks a restarted worker up."""
        watch = self.watches[name]
        member = self.fleet.member(watch.task.host)
        outcome = watch.status.outcome() if watch.status else "failed"
        watch.restarts += 1
        self.view.step(
            f"restarting {watch.label} ({outcome}): restart {watch.restarts} of "
            f"{self.plan.job.max_restarts}"
        )
        try:
            statuses = member.agent.start(
                self.run_id, [self._start_payload(member, watch.task)], self.plan.job.stop_grace
            )
        except HostError as exc:
            raise JobFailed(
                f"restarting {watch.label} failed: {exc.cause}",
                hint=f"the other tasks were stopped; its log: tfdeploy logs {self.run_id} "
                f"--task {name}",
            ) from None
        self._update(statuses)

    def _note_activity(self) -> None:
        """Remembers when each task last wrote a byte, changed state or was restarted."""
        now = self.clock()
        for w in self.watches.values():
            s = w.status
            mark = (s.log_bytes, s.state, s.restarts, w.restarts) if s else ()
            if mark != w.mark:
                w.mark, w.active_at = mark, now

    def _check_stall(self, awaited: list[str]) -> None:
        """stall_timeout: a job whose awaited tasks all stay silent is hung, not working.

        A ParameterServerStrategy chief waits forever, without a word, for a frozen worker; only
        a watchdog outside TensorFlow can end that.
        """
        limit = self.plan.job.stall_timeout
        if limit is None:
            return
        now = self.clock()
        last = max(self.watches[n].active_at for n in awaited)
        if now - last < limit:
            return
        running = [w for w in self.watches.values() if w.status and not w.status.finished]
        frozen = [w.label for w in running if w.status and w.status.frozen]
        silent = [w.label for w in running if now - w.active_at >= limit and w.label not in frozen]
        report = f"silent for {limit:g} s or more: {', '.join(silent) or 'none'}"
        if frozen:
            report += f"; frozen (stopped by a signal, e.g. SIGSTOP): {', '.join(frozen)}"
        raise JobFailed(
            f"job stalled: no awaited task ({', '.join(awaited)}) wrote output or exited for "
            f"{now - last:.0f} s (stall_timeout = {limit:g} s); {report}",
            hint="a frozen or hung peer blocks TensorFlow without an error; every task was "
            f"stopped. Logs: tfdeploy logs {self.run_id}",
        )

    # ---- watching helpers -------------------------------------------------------------

    def _poll_all(self, *, heartbeat: bool = True, tolerate: bool = False) -> dict[str, Poll]:
        members = [self.fleet.member(h) for h in sorted(self.started_hosts - set(self.lost))]

        def poll_one(member: Member) -> Poll:
            offsets = {
                w.task.name: w.offset
                for w in self.watches.values()
                if w.task.host == member.name and w.status is not None
            }
            ports = [t.port for t in self.plan.tasks_on(member.name) if t.port is not None]
            return member.agent.poll(
                self.run_id, offsets, ports=ports, heartbeat=heartbeat, timeout=POLL_TIMEOUT_S
            )

        # At most one poll per host in flight: it carries that host's offsets, so a late reply
        # is still exact. A host that is slow to answer keeps neither the others' heartbeats
        # (their leases) nor their logs waiting beyond POLL_WAIT_S.
        for member in members:
            if member.name not in self._inflight:
                self._inflight[member.name] = self.fleet.submit(poll_one, member)
        deadline = time.monotonic() + (TOLERANT_WAIT_S if tolerate else POLL_WAIT_S)
        polls: dict[str, Poll] = {}
        failures: list[HostError] = []
        for member in members:
            pending = self._inflight[member.name]
            if not pending.wait(max(0.0, deadline - time.monotonic())):
                continue
            del self._inflight[member.name]
            try:
                polls[member.name] = pending.result()
            except HostError as exc:
                failures.append(exc)
        now = self.clock()
        for host in polls:
            if host in self._outages:
                self.view.step(f"contact with {host} is back; logs resume where they stopped")
                self._outages.discard(host)
            self.last_contact[host] = now
        for poll in polls.values():
            self._update(poll.tasks)
            for name, (offset, data) in poll.logs.items():
                self._feed(name, offset, data)
        self._note_activity()
        if not tolerate:
            silent = [m.name for m in members if m.name in self._inflight]
            self._judge_failures(failures, silent, now)
        if self.gpu_monitor.due():
            gpu_members = [self.fleet.member(h) for h in sorted(self.gpu_monitor.hosts)]
            replies, _ = self.fleet.each_settled(lambda m: m.agent.call("gpus"), gpu_members)
            self.gpu_monitor.update({n: GpuReport.from_json(r) for n, r in replies.items()})
        self._show_rows()
        return polls

    def _judge_failures(self, failures: list[HostError], silent: list[str], now: float) -> None:
        """A failed or unanswered poll is an outage until HOST_LOSS_S pass without contact; then
        the host is lost.

        Each retry reconnects if the connection died, so a reset connection costs one tick and
        the logs go on from the same byte offsets.
        """
        waiting = [HostError(h, "its poll is still unanswered") for h in silent]
        for failure in failures + waiting:
            since = now - self.last_contact.setdefault(failure.host, now)
            if failure in waiting and since < HOST_LOSS_S:
                continue  # slow, not (yet) failed: no message
            if since < HOST_LOSS_S:
                if failure.host not in self._outages:
                    self._outages.add(failure.host)
                    self.view.step(
                        f"no answer from {failure.host} ({failure.cause}); retrying for up to "
                        f"{HOST_LOSS_S:g} s"
                    )
                continue
            self.lost[failure.host] = failure.cause
            names = ", ".join(t.name for t in self.plan.tasks_on(failure.host))
            self.view.step(f"host {failure.host} lost after {since:.1f} s without contact")
            raise JobFailed(
                f"host {failure.host} was lost: no contact for {since:.1f} s "
                f"({failure.cause}); its tasks {names} stop by themselves when the "
                f"controller's lease lapses ({self._lease():g} s)",
                hint="the other hosts were stopped; check the host and its network, then "
                f"`tfdeploy status {self.run_id} -i {self.plan.inventory.path}`",
            )

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
                    restarts=max(w.restarts, s.restarts if s else 0),
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
