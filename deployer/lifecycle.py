"""One `up`: preflight every host, push, set up, start in TF's order, watch, and always tear down.

Whatever ends the job (success, a failed task, a missed deadline, Ctrl-C, an error of tfdeploy's
own), every task that was started is stopped before `up` returns, unless the user asked to detach.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
from deployer.plan import Plan, Task
from deployer.preflight import agreed_tensorflow, host_problems
from deployer.secrets import mask_text
from deployer.state import RunRecord, new_run_id, save
from deployer.sync import Manifest, PushResult, push, scan, setup_fingerprint
from deployer.view import View
from deployer.watch import HOST_LOSS_S, HostContact, TaskBoard, server_like

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
        self.board = TaskBoard(plan.tasks)
        self.contact = HostContact()
        self.started_hosts: set[str] = set()  # hosts where start was attempted: polled
        self.contacted_hosts: set[str] = set()  # hosts that may hold the run: teardown's list
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
        tf_versions = agreed_tensorflow(facts)
        problems = [
            problem
            for name, f in facts.items()
            for problem in host_problems(
                name,
                f,
                python=self.fleet.member(name).agent.python,
                job=self.plan.job,
                manifest=manifest,
            )
        ]
        problems += self._check_gpus(facts)
        if self.plan.job.firewall:
            problems += firewall.check(self.fleet, self.members)
        if problems:
            raise HostsFailed(problems)
        python = sorted({str(f.get("python")) for f in facts.values()})
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
        self.board = TaskBoard(self.plan.tasks)
        self.gpu_monitor.hosts = monitored_hosts(self.plan, reports)
        missing = sorted(set(self.plan.job.forward_env) - set(self.forwarded))
        if missing:
            self.view.step(f"warning: forward_env: {', '.join(missing)} are not set here")
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
            self.contact.last[member.name] = self.clock()
            return statuses

        results, failures = self.fleet.each_settled(start_on, members)
        for statuses in results.values():
            self.board.update(statuses)
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
        self.board.start_stall_clock(self.clock())
        while True:
            self._poll_all()
            failed = self.board.first_failure(awaited)
            if failed and self._may_restart(failed):
                self._restart(failed)
                continue
            if failed:
                restarts = self.board[failed].restarts
                after = f" after {restarts} restart(s)" if restarts else ""
                raise self._failure(failed, f"failed{after}")
            if all(self.board.finished(n) for n in awaited):
                break
            job = self.plan.job
            self.board.stall(awaited, job.stall_timeout, self.clock(), self.run_id)
            if not self.board.behind():  # a backlog is read at once: waiting only adds latency
                self.sleep(self.options.poll_interval)
        self._drain()
        self._grace_for_evaluators()
        self.view.step(f"job succeeded: {', '.join(awaited)} exited 0; stopping the rest")
        self.teardown()

    def _drain(self) -> None:
        """Reads what finished tasks wrote after the last poll: every line is shown, even a
        backlog larger than one poll carries."""
        while self.board.behind():
            before = self.board.bytes_read()
            self._poll_all()
            if self.board.bytes_read() == before:
                return  # no progress (a log shrank or vanished): nothing more to show

    def _grace_for_evaluators(self) -> None:
        evaluators = [t.name for t in self.plan.tasks if t.role == "evaluator"]
        if not evaluators:
            return
        grace = self.plan.job.evaluator_grace
        self.view.step(f"waiting up to {grace:g} s for evaluators to finish")
        deadline = self.clock() + grace
        while self.clock() < deadline and not all(self.board.finished(n) for n in evaluators):
            self.sleep(self.options.poll_interval)
            self._poll_all()

    def teardown(self) -> None:
        """Stops the run on every host that may hold it; reports what it could not.

        The stop also ends a setup command still running (Ctrl-C during setup). A host already
        declared lost is not waited for: its supervisors stop its tasks when the lease lapses.
        """
        hosts = sorted((self.contacted_hosts | self.started_hosts) - set(self.contact.lost))
        members = [self.fleet.member(h) for h in hosts]
        if not members or self._torn_down:
            self.firewall_down()
            return
        self._torn_down = True
        for host in sorted(self.contact.lost):
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
        watch, job = self.board[name], self.plan.job
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
        watch = self.board[name]
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
        self.board.update(statuses)

    # ---- watching helpers -------------------------------------------------------------

    def _poll_all(self, *, heartbeat: bool = True, tolerate: bool = False) -> dict[str, Poll]:
        members = [
            self.fleet.member(h) for h in sorted(self.started_hosts - set(self.contact.lost))
        ]

        def poll_one(member: Member) -> Poll:
            offsets = self.board.offsets(member.name)
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
            if self.contact.reached(host, now):
                self.view.step(f"contact with {host} is back; logs resume where they stopped")
        for poll in polls.values():
            self.board.update(poll.tasks)
            for name, (offset, data) in poll.logs.items():
                lines = self.board.feed(name, offset, data)
                if lines:
                    self.view.lines(self.board[name].label, lines)
        self.board.note_activity(now)
        if not tolerate:
            silent = [m.name for m in members if m.name in self._inflight]
            self._judge_failures(failures, silent, now)
        if self.gpu_monitor.due():
            gpu_members = [self.fleet.member(h) for h in sorted(self.gpu_monitor.hosts)]
            replies, _ = self.fleet.each_settled(lambda m: m.agent.call("gpus"), gpu_members)
            self.gpu_monitor.update({n: GpuReport.from_json(r) for n, r in replies.items()})
        self.view.tasks(self.board.rows(self.gpu_monitor.usage))
        return polls

    def _judge_failures(self, failures: list[HostError], silent: list[str], now: float) -> None:
        """Tells the user about outages; fails the job once a host is lost (HOST_LOSS_S)."""

        def outage(failure: HostError) -> None:
            self.view.step(
                f"no answer from {failure.host} ({failure.cause}); retrying for up to "
                f"{HOST_LOSS_S:g} s"
            )

        loss = self.contact.judge(failures, silent, now, outage)
        if loss is None:
            return
        names = ", ".join(t.name for t in self.plan.tasks_on(loss.host))
        self.view.step(f"host {loss.host} lost after {loss.since:.1f} s without contact")
        raise JobFailed(
            f"host {loss.host} was lost: no contact for {loss.since:.1f} s "
            f"({loss.cause}); its tasks {names} stop by themselves when the "
            f"controller's lease lapses ({self._lease():g} s)",
            hint="the other hosts were stopped; check the host and its network, then "
            f"`tfdeploy status {self.run_id} -i {self.plan.inventory.path}`",
        )

    def _failure(self, name: str, what: str) -> JobFailed:
        self._poll_all(heartbeat=True, tolerate=True)  # drain the last log lines of the task
        return self.board.failure(
            name, what, run_id=self.run_id, secret_env=self.plan.job.secret_env
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
