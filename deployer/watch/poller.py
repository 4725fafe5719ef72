"""One tick of watching a run: poll every started host at once, and say what came back.

The poller does the I/O and the bookkeeping (task states, log offsets, host contact) and hands
the caller plain values; deciding what a tick means for the job (fail, restart, go on) and
showing it stay with the caller, as rich keeps its Live loop apart from what it renders.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.core.errors import HostError
from deployer.hosts.fleet import Fleet, Member, Pending
from deployer.hosts.gpus import GpuMonitor, GpuReport
from deployer.hosts.replies import MetricRecords
from deployer.hosts.reply_types import Poll
from deployer.results.archive import LogArchive
from deployer.watch.contact import HostContact, Loss
from deployer.watch.runstate import OnRun, RunState

# A poll is one short agent call; one that takes longer is a failed contact (and is retried).
POLL_TIMEOUT_S = 8.0
POLL_WAIT_S = 1.0  # how long one tick waits for slow hosts before going on without them
TOLERANT_WAIT_S = 2.0  # final reads (teardown, failure reports) wait this long for stragglers


@dataclass(frozen=True)
class Tick:
    """What one round of polls brought: new log lines per task label, and news of the hosts."""

    polls: Mapping[str, Poll]
    lines: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (task label, its new lines)
    recovered: tuple[str, ...] = ()  # hosts answering again after an outage
    outages: tuple[HostError, ...] = ()  # hosts that just stopped answering (not yet lost)
    loss: Loss | None = None  # the first host past the loss threshold, if any


class Poller(OnRun):
    """Keeps at most one poll per host in flight and folds the answers into the board."""

    def __init__(
        self,
        fleet: Fleet,
        run: RunState,
        *,
        gpu_monitor: GpuMonitor | None = None,
        wait_s: float = POLL_WAIT_S,
        archive: LogArchive | None = None,
    ) -> None:
        self.fleet = fleet
        self.run = run
        self.gpu_monitor = gpu_monitor
        self.wait_s = wait_s
        self.archive = archive  # every byte read is also kept on this machine
        self.hosts: set[str] = set()  # hosts where a start was attempted: the ones polled
        self.contact = HostContact()
        self._inflight: dict[str, Pending[Poll]] = {}

    def forget(self, host: str) -> None:
        """`host` is gone for good (replaced): no more polls, no judgement of its silence."""
        self.hosts.discard(host)
        self._inflight.pop(host, None)
        self.contact.forget(host)

    def rewatch(self, host: str) -> None:
        """`host`, lost, answers again (a link that came back): polled from the next tick on,
        its silence judged afresh; a poll left in flight on its dead connection is dropped."""
        self.hosts.add(host)
        self._inflight.pop(host, None)
        self.contact.forget(host)

    def watch_host(self, host: str) -> None:
        """From now on, `host` is polled (a start was attempted there)."""
        self.hosts.add(host)

    def abandon(self) -> None:
        """Forgets polls in flight (their connections were dropped after Ctrl-C)."""
        self._inflight.clear()

    def tick(self, *, heartbeat: bool = True, tolerate: bool = False) -> Tick:
        """Polls every reachable started host; `tolerate`: a final read, judging no host."""
        members = [self.fleet.member(h) for h in sorted(self.hosts - set(self.contact.lost))]
        for member in members:
            if member.name not in self._inflight:
                self._inflight[member.name] = self.fleet.submit(
                    lambda m: self._poll(m, heartbeat), member
                )
        polls, failures = self._collect(members, TOLERANT_WAIT_S if tolerate else self.wait_s)
        now = self.clock()
        recovered = tuple(h for h in polls if self.contact.reached(h, now))
        lines = self._fold(polls)
        self.board.note_activity(now)
        self._refresh_gpus()
        if tolerate:
            return Tick(polls, lines, recovered)
        silent = [m.name for m in members if m.name in self._inflight]
        verdict = self.contact.judge(failures, silent, now)
        return Tick(polls, lines, recovered, verdict.outages, verdict.loss)

    def _poll(self, member: Member, heartbeat: bool) -> Poll:
        # The request carries this host's offsets, so even a late reply is exact.
        ports = [t.port for t in self.plan.tasks_on(member.name) if t.port is not None]
        return member.agent.poll(
            self.run_id,
            self.board.offsets(member.name),
            ports=ports,
            heartbeat=heartbeat,
            timeout=POLL_TIMEOUT_S,
            metrics=self.board.metric_offsets(member.name),
        )

    def _collect(
        self, members: list[Member], wait_s: float
    ) -> tuple[dict[str, Poll], list[HostError]]:
        """The answers that arrive within `wait_s`: a slow host keeps neither the others'
        heartbeats (their leases) nor their logs waiting; its poll stays in flight."""
        deadline = time.monotonic() + wait_s  # real time: threads are waited on, not the clock
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
        return polls, failures

    def _fold(self, polls: Mapping[str, Poll]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        lines: list[tuple[str, tuple[str, ...]]] = []
        for poll in polls.values():
            self.board.update(poll.tasks)
            self._fold_metrics(poll)
            for name, (offset, data) in poll.logs.items():
                if self.archive is not None:
                    host = self.board[name].task.host
                    self.archive.write(name, host, offset - len(data), data)
                new = self.board.feed(name, offset, data)
                if new:
                    lines.append((self.board[name].label, tuple(new)))
        return tuple(lines)

    def _fold_metrics(self, poll: Poll) -> None:
        """The tasks' new metrics records and resource samples into their series (and the
        local archive, so `runs` and `report` have them after the hosts are gone)."""
        now = time.time()
        for name, (offset, records) in poll.metrics.items():
            series = self.board[name].series
            series.offset = offset
            series.add_records(records, now)
            if self.archive is not None:  # none read: the lines dropped still count
                self.archive.write_metrics(name, _timed(records, now))
        for status in poll.tasks:
            if status.usage is None or status.name not in self.board.watches:
                continue
            watch = self.board[status.name]
            gpu = self.gpu_monitor.numbers(watch.task) if self.gpu_monitor else {}
            sample = {"cpu": status.usage.cpu, "rss": float(status.usage.rss), **gpu}
            watch.series.add_sample(now, **sample)
            if self.archive is not None:
                self.archive.write_usage(status.name, {"t": round(now, 3), **sample})

    def _refresh_gpus(self) -> None:
        monitor = self.gpu_monitor
        if monitor is None or not monitor.due():
            return
        members = [self.fleet.member(h) for h in sorted(monitor.hosts)]
        replies, _ = self.fleet.each_settled(lambda m: m.agent.gpus(), members)
        monitor.update({n: GpuReport.from_json(r) for n, r in replies.items()})


def _timed(records: tuple[dict[str, float], ...], now: float) -> MetricRecords:
    """The records as the local store keeps them: one without its own `time` gets the time it
    arrived here (within a poll of when the task wrote it), which the report needs to place a
    restart among the steps (deployer/api/reportpage.py); `time` goes last, so a record of
    METRIC_KEYS numbers keeps its own. The count of lines dropped rides along."""
    dropped = records.dropped if isinstance(records, MetricRecords) else 0
    return MetricRecords(
        (r if "time" in r else {**r, "time": round(now, 3)} for r in records), dropped
    )
