"""The cost of a run's EC2 instances: each instance's type, market, zone and running time, priced
from AWS's own APIs (pricing.py), per launch group. This module's `price` is what the registry
(deployer/sources PRICING) names for the `instances` that `up` keeps in a run's facts.

Which seconds count: an instance counts from its launch, or the run's start if later, to its
end, or the run's end if earlier (now, while the run goes on). So a discovered instance that
serves many runs is paid once, by each run for its own time, and the idle time of a launched
instance after its run ended (until `down` or its idle stop) is no run's. The facts come from
EC2 where it still lists the instance (describe_instances, the authority); an instance it no
longer lists (it lists a terminated one for about an hour) is priced from the run's record and
the end this machine kept (ends.py), and without a kept end it is "cost unknown".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from deployer.core.errors import TfdeployError
from deployer.core.lines import clean
from deployer.sources.aws import ends, pricing
from deployer.sources.aws.discovery import client_for, platform_of
from deployer.sources.aws.settings import GROUP_TAG, LINUX, AwsSettings
from deployer.sources.costs import GroupCost, MachineCost, RunCost, Span, stamp

# EC2's StateTransitionReason of a stopped or terminated instance: "User initiated
# (2026-12-07 23:12:35 GMT)" (GMT from EC2, UTC from its stand-ins).
_ENDED_AT = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")
RUNNING = ("pending", "running")  # states whose time is billed, the end not yet come
FILTER_VALUES = 200  # instance ids per describe_instances filter (EC2's bound on values)
History = list[tuple[float, Decimal]]  # spot prices: (since, USD per hour), oldest first
T = TypeVar("T")


@dataclass(frozen=True)
class Recorded:
    """One instance as the run's facts keep it (the `plan --json` document of discovery.py)."""

    id: str
    group: str
    region: str | None
    profile: str | None
    kind: str = ""
    zone: str = ""
    spot: bool = False
    launched: float | None = None
    platform: str = LINUX
    tenancy: str = "default"


@dataclass(frozen=True)
class Life:
    """An instance as it is priced: what it was, and when it ran (ended None: it runs)."""

    kind: str
    zone: str
    spot: bool
    launched: float
    ended: float | None
    platform: str = LINUX
    tenancy: str = "default"


def _clients_config() -> Any:
    """Short timeouts and few retries: `runs` asks for every AWS run it lists, and a network
    that drops packets must cost seconds, not minutes, before it says "cost unknown"."""
    try:
        from botocore.config import Config
    except ImportError:
        return None  # client_for says how to install boto3
    return Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2})


def _ec2(region: str | None, profile: str | None) -> Any:
    settings = AwsSettings(region=region, profile=profile, groups=())
    return client_for(settings, "ec2", _clients_config())


def _pricing(profile: str | None) -> Any:
    settings = AwsSettings(region=pricing.PRICING_REGION, profile=profile, groups=())
    return client_for(settings, "pricing", _clients_config())


@dataclass(frozen=True)
class Clients:
    """How the AWS clients are made (tests hand in stand-ins for the Pricing API)."""

    ec2: Callable[[str | None, str | None], Any] = _ec2
    pricing: Callable[[str | None], Any] = _pricing


CLIENTS = Clients()


def price(documents: Sequence[object], hosts: Sequence[str], span: Span) -> RunCost:
    """The run's instances (`documents` as its facts keep them; `hosts`: the run's hosts, of
    which an instance id not among the documents took a lost host's place) priced over the
    run's `span`, per launch group."""
    recorded = [r for r in (_recorded(d) for d in documents) if r is not None]
    known = {r.id for r in recorded}
    if recorded:
        first = recorded[0]
        recorded += [
            Recorded(h, "", first.region, first.profile)
            for h in dict.fromkeys(hosts)
            if ends.INSTANCE_ID.match(h) and h not in known
        ]
    damaged = len(documents) - len(known)
    wanted: dict[tuple[str | None, str | None], list[str]] = {}
    for r in recorded:
        wanted.setdefault((r.region, r.profile), []).append(r.id)
    pricer = _Pricer(span, CLIENTS, wanted)
    machines = [pricer.machine(r) for r in recorded]
    if damaged:
        why = f"{damaged} of the run's recorded instances cannot be read (its facts were edited?)"
        machines.append(MachineCost("?", "?", "?", "?", "?", unknown=why))
    ends.note(pricer.seen_ending)
    groups: dict[str, list[MachineCost]] = {}
    for m in machines:
        groups.setdefault(m.group, []).append(m)
    grouped = tuple(GroupCost(g, tuple(ms)) for g, ms in groups.items())
    return RunCost(grouped, span.now, running=span.ended is None)


@dataclass
class _Pricer:
    """One pricing of a run: EC2 asked once per region, each price once per type and zone."""

    span: Span
    clients: Clients
    wanted: dict[tuple[str | None, str | None], list[str]]  # (region, profile) -> instance ids
    described: dict[tuple[str | None, str | None], dict[str, Any] | str] = field(
        default_factory=dict
    )
    histories: dict[tuple[Any, ...], History | pricing.PriceUnknown] = field(default_factory=dict)
    rates: dict[tuple[Any, ...], pricing.Rate | pricing.PriceUnknown] = field(default_factory=dict)
    kept_ends: dict[str, float] = field(default_factory=ends.known)
    seen_ending: dict[str, float] = field(default_factory=dict)

    def machine(self, rec: Recorded) -> MachineCost:
        described = self._described(rec)
        if isinstance(described, str):
            return _unknown(rec, described)
        raw = described.get(rec.id)
        if raw is not None and not rec.group:
            rec = replace(rec, group=_tag(raw, GROUP_TAG) or "(a replacement)")
        life = self._life(rec, raw)
        if isinstance(life, str):
            return _unknown(rec, life)
        cost = MachineCost(
            rec.id,
            rec.group,
            life.kind,
            "spot" if life.spot else "on-demand",
            life.zone,
            start=max(life.launched, self.span.began),
        )
        end = min(self.span.end, life.ended if life.ended is not None else self.span.now)
        cost = replace(cost, end=max(end, cost.start or end))
        if life.platform != LINUX or life.tenancy != "default":
            return replace(
                cost,
                unknown=f"{rec.id} is {life.platform}, {life.tenancy} tenancy: "
                f"tfdeploy prices {LINUX} on shared tenancy only",
            )
        return self._priced(rec, cost)

    def _described(self, rec: Recorded) -> dict[str, Any] | str:
        """EC2's view of every instance of the run in `rec`'s region (asked once), or why not."""
        key = (rec.region, rec.profile)
        if key not in self.described:
            ids = self.wanted.get(key, [])
            self.described[key] = _describe(self.clients, rec.region, rec.profile, ids)
        return self.described[key]

    def _life(self, rec: Recorded, raw: dict[str, Any] | None) -> Life | str:
        if raw is None:
            return self._remembered(rec)
        state = str(raw.get("State", {}).get("Name") or "?")
        launched = raw.get("LaunchTime")
        if not isinstance(launched, datetime):
            return f"EC2 gives no launch time for {rec.id}"
        ended = None
        if state not in RUNNING:
            ended = _ended_at(raw) or self.kept_ends.get(rec.id)
            if ended is None:
                return f"EC2 does not say when {rec.id} ended (state {state})"
            if rec.id not in self.kept_ends:
                self.seen_ending[rec.id] = ended
        return Life(
            kind=str(raw.get("InstanceType") or "?"),
            zone=str(raw.get("Placement", {}).get("AvailabilityZone") or "?"),
            spot=raw.get("InstanceLifecycle") == "spot",
            launched=launched.timestamp(),
            ended=ended,
            platform=platform_of(raw),
            tenancy=str(raw.get("Placement", {}).get("Tenancy") or "default"),
        )

    def _remembered(self, rec: Recorded) -> Life | str:
        """An instance EC2 no longer lists: the run's record of it, and the end kept here."""
        ended = self.kept_ends.get(rec.id)
        if ended is None or rec.launched is None or not rec.kind:
            return (
                f"EC2 no longer lists {rec.id} (it lists a terminated instance for about an "
                "hour) and this machine did not see when it ended"
            )
        return Life(rec.kind, rec.zone, rec.spot, rec.launched, ended, rec.platform, rec.tenancy)

    def _priced(self, rec: Recorded, cost: MachineCost) -> MachineCost:
        assert cost.start is not None and cost.end is not None
        if cost.end <= cost.start:  # it ran at no time of the run: nothing to ask
            return replace(cost, usd=Decimal(0))
        try:
            if cost.market == "spot":
                history = self._spot(rec, cost)
                usd = pricing.integrate(history, cost.start, cost.end)
                where = f"spot price history, {cost.zone}, as of {stamp(self.span.now)}"
                return replace(cost, usd=usd, source=where)
            rate = self._rate(rec, cost.kind)
            hours = Decimal(repr(cost.end - cost.start)) / 3600
            listed = (
                f"AWS price list, {rate.published[:10]}" if rate.published else "AWS price list"
            )
            return replace(cost, usd=rate.usd_per_hour * hours, source=listed)
        except pricing.PriceUnknown as exc:
            return replace(cost, unknown=str(exc))

    def _spot(self, rec: Recorded, cost: MachineCost) -> History:
        key = (rec.region, rec.profile, cost.kind, cost.zone)
        if key not in self.histories:
            self.histories[key] = _asked(
                "the spot price history",
                lambda: pricing.spot_history(
                    self.clients.ec2(rec.region, rec.profile),
                    cost.kind,
                    cost.zone,
                    _utc(self.span.began),
                    _utc(self.span.end),
                ),
            )
        found = self.histories[key]
        if isinstance(found, pricing.PriceUnknown):
            raise found
        return found

    def _rate(self, rec: Recorded, kind: str) -> pricing.Rate:
        key = (rec.region, rec.profile, kind)
        if key not in self.rates:
            region = rec.region or "?"
            self.rates[key] = _asked(
                "the AWS price list",
                lambda: pricing.on_demand_rate(self.clients.pricing(rec.profile), kind, region),
            )
        found = self.rates[key]
        if isinstance(found, pricing.PriceUnknown):
            raise found
        return found


def _asked(what: str, ask: Callable[[], T]) -> T | pricing.PriceUnknown:
    """What `ask` answered, or the PriceUnknown that says why not (kept, so one refusal is not
    asked again for every instance)."""
    try:
        return ask()
    except pricing.PriceUnknown as exc:
        return exc
    except Exception as exc:  # boto3's and botocore's many errors: each becomes words
        return pricing.PriceUnknown(f"{what}: {_reason(exc)}")


def _describe(
    clients: Clients, region: str | None, profile: str | None, ids: Sequence[str]
) -> dict[str, Any] | str:
    """Each instance EC2 lists among `ids` (a filter, not InstanceIds: one id EC2 forgot would
    fail the whole call), or why EC2 could not be asked."""
    found: dict[str, Any] = {}
    try:
        client = clients.ec2(region, profile)
        for at in range(0, len(ids), FILTER_VALUES):
            chunk = list(ids[at : at + FILTER_VALUES])
            pages = client.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": chunk}]
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        if isinstance(raw, dict) and raw.get("InstanceId") in chunk:
                            found[raw["InstanceId"]] = raw
    except Exception as exc:  # no credentials, no network, refused: the run says why
        return f"EC2 describe_instances in {region or 'the default region'}: {_reason(exc)}"
    return found


def _reason(exc: BaseException) -> str:
    """An error of boto3 or tfdeploy as one clean line for the terminal."""
    text = exc.message if isinstance(exc, TfdeployError) else str(exc)
    return clean(" ".join(text.split()))[:300] or type(exc).__name__


def _recorded(document: object) -> Recorded | None:
    """A document of the run's facts (untrusted: a local file), or None when it is none."""
    if not isinstance(document, dict) or not isinstance(document.get("id"), str):
        return None
    ident = document["id"]
    if not ends.INSTANCE_ID.match(ident):
        return None
    launched = _time(document.get("launched"))
    return Recorded(
        id=ident,
        group=_text(document.get("group")) or "?",
        region=_text(document.get("region")) or None,
        profile=_text(document.get("profile")) or None,
        kind=_text(document.get("type")),
        zone=_text(document.get("zone")),
        spot=document.get("spot") is True,
        launched=launched,
        platform=_text(document.get("platform")) or LINUX,
        tenancy=_text(document.get("tenancy")) or "default",
    )


def _unknown(rec: Recorded, why: str) -> MachineCost:
    market = "spot" if rec.spot else "on-demand"
    return MachineCost(
        rec.id, rec.group or "?", rec.kind or "?", market, rec.zone or "?", unknown=why
    )


def _ended_at(raw: Mapping[str, Any]) -> float | None:
    found = _ENDED_AT.search(str(raw.get("StateTransitionReason") or ""))
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _tag(raw: Mapping[str, Any], key: str) -> str:
    tags: Iterable[Any] = raw.get("Tags") or ()
    return next((str(t.get("Value")) for t in tags if t.get("Key") == key), "")


def _time(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _text(value: object) -> str:
    return value[:100] if isinstance(value, str) else ""
