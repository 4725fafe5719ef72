"""What a run's machines cost, in the shapes every reader shows (`runs`, `status`, the report),
and the one entry point that hands a run's recorded machines to the source that can price them.

A source that can price its machines names a module in the registry (deployer/sources PRICING,
keyed by the `plan --json` key its machines are listed under); that module's `price` answers a
RunCost. A price that cannot be had is a machine with `unknown` set, saying why, and makes the
group's and the run's total unknown too: a partial sum would read as the run's cost.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from deployer.core.lines import clean


@dataclass(frozen=True)
class Span:
    """The time a run holds its machines for: from `up`'s start to the run's end (None: it goes
    on, and the cost is what it cost so far), and the time the cost is asked at."""

    began: float
    ended: float | None
    now: float

    @property
    def end(self) -> float:
        return self.now if self.ended is None else min(self.ended, self.now)


@dataclass(frozen=True)
class MachineCost:
    """One machine over the seconds it counts for the run: when, its price, and the price's
    source; `unknown` says why there is no price (then `usd` is None)."""

    id: str
    group: str
    kind: str  # the instance type
    market: str  # "spot" or "on-demand"
    zone: str
    start: float | None = None
    end: float | None = None
    usd: Decimal | None = None
    source: str = ""
    unknown: str = ""

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600 if self.start and self.end else 0.0


@dataclass(frozen=True)
class GroupCost:
    """A launch group's machines (`aws.hosts[0]`): summed, unless one has no price."""

    group: str
    machines: tuple[MachineCost, ...]

    @property
    def usd(self) -> Decimal | None:
        if any(m.usd is None for m in self.machines):
            return None
        return sum((m.usd for m in self.machines if m.usd is not None), Decimal(0))

    @property
    def unknown(self) -> str:
        return next((m.unknown for m in self.machines if m.usd is None), "")

    @property
    def sources(self) -> tuple[str, ...]:
        return _distinct(m.source for m in self.machines if m.source)

    def describe(self) -> str:
        """'2 x g5.xlarge, spot': what the group ran."""
        kinds = _distinct(f"{m.kind}, {m.market}" for m in self.machines)
        return "; ".join(
            f"{sum(1 for m in self.machines if f'{m.kind}, {m.market}' == k)} x {k}" for k in kinds
        )


@dataclass(frozen=True)
class RunCost:
    """What a run's machines cost, per group and in total, priced at `priced_at`. `running`:
    the run goes on, so this is the cost so far. `final`: every price was had and the run has
    ended; the figure no longer changes and may be kept (the spot price history goes back 90
    days, and EC2 lists a terminated instance for about an hour)."""

    groups: tuple[GroupCost, ...]
    priced_at: float
    running: bool = False

    @property
    def usd(self) -> Decimal | None:
        totals = [g.usd for g in self.groups]
        if any(t is None for t in totals):
            return None
        return sum((t for t in totals if t is not None), Decimal(0))

    @property
    def unknown(self) -> str:
        return next((g.unknown for g in self.groups if g.usd is None), "")

    @property
    def final(self) -> bool:
        return not self.running and self.usd is not None

    @property
    def sources(self) -> tuple[str, ...]:
        return _distinct(s for g in self.groups for s in g.sources)

    def cell(self) -> str:
        """The cost in a table's cell: '$1.23', '$1.23 so far', 'unknown'."""
        total = self.usd
        if total is None:
            return "unknown"
        return usd_text(total) + (" so far" if self.running else "")

    def line(self) -> str:
        """The cost in one line, per group with its price source: what `runs` and `status`
        print under a run."""
        total = self.usd
        if total is None:
            return f"cost unknown: {self.unknown}"
        shared = len({g.sources for g in self.groups}) == 1  # then said once, at the end

        def group(g: GroupCost) -> str:
            said = f"{g.group} {g.describe()} {usd_text(g.usd or Decimal(0))}"
            return said if shared or not g.sources else f"{said} ({', '.join(g.sources)})"

        groups = "; ".join(group(g) for g in self.groups)
        said = f" ({', '.join(self.sources)})" if shared and self.sources else ""
        return f"cost {self.cell()}: {groups}{said}"

    def to_json(self) -> dict[str, Any]:
        """For `status --json`, `runs --json` and the run's kept cost.json."""
        total = self.usd
        return {
            "usd": _number(total),
            "currency": "USD",
            "running": self.running,
            "final": self.final,
            "priced_at": self.priced_at,
            "unknown": self.unknown or None,
            "sources": list(self.sources),
            "groups": [_group_json(g) for g in self.groups],
        }


def _group_json(g: GroupCost) -> dict[str, Any]:
    return {
        "group": g.group,
        "usd": _number(g.usd),
        "machines": g.describe(),
        "unknown": g.unknown or None,
        "instances": [
            {
                "id": m.id,
                "type": m.kind,
                "market": m.market,
                "zone": m.zone,
                "from": m.start,
                "to": m.end,
                "hours": round(m.hours, 6),
                "usd": _number(m.usd),
                "source": m.source or None,
                "unknown": m.unknown or None,
            }
            for m in g.machines
        ],
    }


def from_json(data: object) -> RunCost | None:
    """A kept cost.json read back, checked field by field (a local file: a full disk cuts one,
    a person edits one); None when it is not one this version writes, and the cost is asked
    again."""
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        return None
    priced_at = _finite(data.get("priced_at"))
    if priced_at is None or not isinstance(data.get("running"), bool):
        return None
    groups = []
    for g in data["groups"]:
        if not isinstance(g, dict) or not isinstance(g.get("group"), str):
            return None
        machines = _machines(_text(g["group"]), g.get("instances"))
        if machines is None:
            return None
        groups.append(GroupCost(_text(g["group"]), machines))
    return RunCost(tuple(groups), priced_at, data["running"])


def _machines(group: str, listed: object) -> tuple[MachineCost, ...] | None:
    found = []
    for m in listed if isinstance(listed, list) else []:
        if not isinstance(m, dict):
            return None
        texts = [m.get(k) for k in ("id", "type", "market", "zone")]
        usd = _finite(m.get("usd"))
        if not all(isinstance(t, str) for t in texts) or (usd is None) != (m.get("usd") is None):
            return None
        if usd is not None and usd < 0:
            return None
        ident, kind, market, zone = (_text(t) for t in texts)
        found.append(
            MachineCost(
                ident,
                group,
                kind,
                market,
                zone,
                start=_finite(m.get("from")),
                end=_finite(m.get("to")),
                usd=None if usd is None else Decimal(str(usd)),
                source=_text(m.get("source")),
                unknown=_text(m.get("unknown")) or ("" if usd is not None else "not recorded"),
            )
        )
    return tuple(found) if found else None


def price_run(machines: Mapping[str, object], hosts: Sequence[str], span: Span) -> RunCost | None:
    """The cost of a run's machines, as `up` recorded them (`machines`: the `plan --json` key
    of each source's machines -> their documents) with the run's `hosts` (a machine that took
    a lost one's place is a host only); None when no source can price any of them, and then
    nothing was asked of any cloud."""
    from deployer.sources import PRICING

    costs = [
        importlib.import_module(PRICING[key]).price(documents, hosts, span)
        for key, documents in machines.items()
        if key in PRICING and isinstance(documents, list) and documents
    ]
    if not costs:
        return None
    groups = tuple(g for c in costs for g in c.groups)
    return RunCost(groups, min(c.priced_at for c in costs), any(c.running for c in costs))


def usd_text(amount: Decimal) -> str:
    """'$12.30', '$0.0413', '<$0.0001': cents for dollars, more digits for small amounts."""
    if amount >= 1:
        return f"${amount:,.2f}"
    if 0 < amount < Decimal("0.0001"):
        return "<$0.0001"
    return f"${amount:.4f}"


def stamp(t: float) -> str:
    """A UTC time as sources are dated: '2026-12-07 23:12 UTC'."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _distinct(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _number(amount: Decimal | None) -> float | None:
    return None if amount is None else float(round(amount, 6))


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: object) -> str:
    return clean(value[:300]) if isinstance(value, str) else ""
