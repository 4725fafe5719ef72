"""`tfdeploy prune`: frees the hosts of an inventory of old runs, and of the contents and
environments no run left there uses (docs/results.md "Pruning hosts"; the rules, per host, are
remote/prune.py's).

Hosts sharing one workdir (an NFS home) are pruned one after the other: the store and the
environments are common to them, and each host's prune counts the runs left by the others as
users, so the last prune of a group frees what only the group's pruned runs used.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from deployer.api.inventories import InventoryLike, load
from deployer.config.inventory import discover_hosts
from deployer.core.errors import HostsFailed, UsageError
from deployer.core.text import join_names, plural, size
from deployer.hosts.fleet import DEFAULT_CONCURRENCY, Fleet, Member
from deployer.up.preflight import shared_workdirs
from remote.protocol import PRUNE_GRACE_S

DEFAULT_KEEP = 3  # runs of each job kept on each host
DEFAULT_GRACE_S = PRUNE_GRACE_S  # what changed this recently stays
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
Say = Callable[[str], None]


@dataclass(frozen=True)
class HostPruned:
    """What one host's prune removed (or, dry, would remove)."""

    host: str
    runs: tuple[str, ...] = ()
    running: tuple[str, ...] = ()  # chosen by the rules, kept because they may still run
    contents: int = 0
    environments: tuple[str, ...] = ()
    bytes: int = 0
    checkpoints: tuple[str, ...] = ()  # jobs whose own checkpoint folder went (no run left)

    def line(self, dry_run: bool) -> str:
        verb = "would free" if dry_run else "freed"
        what = [
            plural(len(self.runs), "run"),
            plural(self.contents, "content"),
            plural(len(self.environments), "environment"),
        ]
        if self.checkpoints:
            what.append(f"the checkpoints of job {join_names(list(self.checkpoints))}")
        said = f"{self.host}: {verb} {join_names(what)}, {size(self.bytes)}"
        if self.running:
            said += f"; kept {plural(len(self.running), 'run')} that may still run"
            said += f" ({', '.join(self.running)})"
        return said


@dataclass(frozen=True)
class PruneResult:
    hosts: tuple[HostPruned, ...]
    dry_run: bool

    @property
    def bytes(self) -> int:
        return sum(h.bytes for h in self.hosts)


def prune(
    inventory: InventoryLike,
    *,
    keep: int = DEFAULT_KEEP,
    older_than: float | datetime.datetime | datetime.timedelta | None = None,
    dry_run: bool = False,
    grace: float = DEFAULT_GRACE_S,
    concurrency: int = DEFAULT_CONCURRENCY,
    say: Say | None = None,
) -> PruneResult:
    """On every host of the inventory: removes the runs past the newest `keep` of each job
    (and, with `older_than`, only those created before it: a time, a datetime, or an age as a
    timedelta), then the contents and environments that no run left on the workdir uses. A run
    that may still run is never removed, nor anything it uses, nor what changed within `grace`
    seconds (it may be on its way into a run that is starting). `say` gets one line per host.
    A host that could not be pruned is raised (HostsFailed) after the others were."""
    if keep < 0 or grace < 0:
        raise UsageError(f"keep and grace must be 0 or more, got {keep} and {grace}")
    before = _timestamp(older_than)
    hosts = discover_hosts(load(inventory)).hosts
    with Fleet(hosts, concurrency=concurrency) as fleet:
        looked, failures = fleet.each_settled(lambda m: m.agent.look_in())
        present = {h: facts for h, facts in looked.items() if facts is not None}
        groups = shared_workdirs(list(present), present)
        firsts = [fleet.member(g[0]) for g in groups]
        by_first = {g[0]: g for g in groups}

        def in_turn(first: Member) -> list[HostPruned]:
            rules = _Rules(keep, before, dry_run, grace)
            return [_one(fleet.member(h), rules) for h in by_first[first.name]]

        done, failed = fleet.each_settled(in_turn, firsts)
    pruned = {p.host: p for group in done.values() for p in group}
    result = PruneResult(
        tuple(pruned.get(h.name, HostPruned(h.name)) for h in hosts if h.name in looked),
        dry_run,
    )
    for host in result.hosts:
        if say is not None:
            say(host.line(dry_run))
    if failures or failed:
        raise HostsFailed([*failures, *failed], what="pruning failed", outcome=_outcome(result))
    return result


@dataclass(frozen=True)
class _Rules:
    keep: int
    older_than: float | None
    dry_run: bool
    grace: float


def _one(member: Member, rules: _Rules) -> HostPruned:
    reply = member.agent.prune(
        rules.keep, older_than=rules.older_than, dry_run=rules.dry_run, grace=rules.grace
    )
    return HostPruned(
        member.name,
        tuple(reply["runs"]),
        tuple(reply["running"]),
        reply["contents"],
        tuple(reply["environments"]),
        reply["bytes"],
        tuple(reply["checkpoints"]),
    )


def _timestamp(when: float | datetime.datetime | datetime.timedelta | None) -> float | None:
    if when is None or isinstance(when, int | float):
        return when
    if isinstance(when, datetime.timedelta):
        return _ago(when)
    return when.timestamp()  # a naive datetime is local time, as `datetime` takes it


def _ago(age: datetime.timedelta) -> float:
    return (datetime.datetime.now(datetime.UTC) - age).timestamp()


def _outcome(result: PruneResult) -> str:
    done = [h.host for h in result.hosts if h.runs or h.contents or h.environments or h.checkpoints]
    return f"pruned on {join_names(done)}" if done else "nothing was removed"


def parse_duration(text: str) -> float | None:
    """`90`, `90s`, `30m`, `12h`, `7d`, `2w` in seconds; None for anything else."""
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].isalpha() else (text, "s")
    if unit in UNITS and number.replace(".", "", 1).isdigit():
        return float(number) * UNITS[unit]
    return None


def parse_grace(text: str) -> float:
    """--grace: a duration (0, 30m, 1h)."""
    seconds = parse_duration(text)
    if seconds is None:
        raise UsageError(
            f"--grace {text!r} is not a duration", hint="a duration such as 0, 90s, 30m, 1h"
        )
    return seconds


def parse_age(text: str) -> float:
    """--older-than: a date (`2025-03-01`, `2025-03-01T12:00`, local time unless it names a
    zone) or an age (`30m`, `12h`, `7d`, `2w`); the Unix time before which runs may go."""
    seconds = parse_duration(text) if text[-1:].isalpha() else None
    if seconds is not None:
        return _ago(datetime.timedelta(seconds=seconds))
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UsageError(
            f"--older-than {text!r} is neither a date nor an age",
            hint="a date such as 2025-03-01 (or 2025-03-01T12:00), or an age: 30m, 12h, 7d, 2w",
        ) from None


def summary(result: PruneResult) -> str:
    """The closing line: what all hosts together freed."""
    verb = "would free" if result.dry_run else "freed"
    runs = sum(len(h.runs) for h in result.hosts)
    hosts = plural(len(result.hosts), "host")
    return f"{verb} {size(result.bytes)} in all: {plural(runs, 'run')} on {hosts}"
