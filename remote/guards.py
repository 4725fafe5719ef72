"""A run's guards: the rules that stop a run on purpose before it is done, for what it costs
(`[aws] max_cost`) or for GPUs that sit idle (`[job] gpu_idle_stop`); docs/up.md, "Guards".

One module for both holders of a run, so one rule decides and says it in the same words: the
run's keeper applies it on a host (keeper.py), an attached `up` that holds its run itself on the
controller (deployer/watch/guards.py). Nothing here asks a cloud or a GPU, and no other module
of remote/ is imported (the control side imports this one as `remote.guards`): the cost comes
priced by the controller, which alone can ask AWS, and the GPU numbers from whoever sampled
them (the wardens, warden.py; the live view, deployer/hosts/gpus.py).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence, Tuple

COST, GPU_IDLE = "max_cost", "gpu_idle_stop"  # the guards' names, as the inventory spells them
GPU_STALE_S = 30.0  # a GPU sample older than this says nothing of now (its host went quiet)

Gpu = Tuple[str, int]  # (host, GPU index): one GPU of the run
Samples = Mapping[str, Mapping[int, float]]  # host -> GPU index -> utilization (%)


@dataclass(frozen=True)
class CostCap:
    """`max_cost`, and the run's instances as the controller priced them from AWS's APIs: what
    they had cost the run by then, and what they cost an hour (those still running). What they
    cost since is that rate times the time passed, so the keeper, on a host, asks no cloud."""

    max_usd: float
    spent_usd: float
    usd_per_hour: float

    def spent(self, seconds: float) -> float:
        """The run's cost `seconds` after it was priced."""
        return self.spent_usd + self.usd_per_hour * max(seconds, 0.0) / 3600

    def reached(self, seconds: float) -> str | None:
        """Why the run stops `seconds` after it was priced; None while its cost is below."""
        spent = self.spent(seconds)
        if spent < self.max_usd:
            return None
        return f"its cost reached max_cost {usd(self.max_usd)} (spent {usd(spent)})"


@dataclass(frozen=True)
class GpuIdle:
    """`gpu_idle_stop`: the run stops once every GPU of it was below `below` % for `minutes`."""

    below: float
    minutes: float

    def since(
        self, since: float | None, utilizations: Sequence[float] | None, now: float
    ) -> float | None:
        """When the idle window began, after one look at every GPU of the run at `now`: it goes
        on while each is below the floor, and starts again at a GPU above it or one with no
        number (None: a host that said nothing, a GPU with no utilization)."""
        if not utilizations or any(u >= self.below for u in utilizations):
            return None
        return now if since is None else since

    def reached(self, since: float | None, now: float) -> str | None:
        if since is None or now - since < self.minutes * 60:
            return None
        return f"every GPU of the run below {self.below:g} % for {duration(self.minutes * 60)}"


class Guards:
    """One run's guards as its holder applies them, with the idle window's state: `look` at
    each judgment, on the holder's own clock (monotonic seconds; `start`: when the cost was
    priced). `gpus`: every GPU the run's tasks were given."""

    def __init__(
        self,
        cost: CostCap | None,
        idle: GpuIdle | None,
        gpus: Collection[Gpu],
        start: float,
    ) -> None:
        self.cost, self.idle, self.gpus, self.start = cost, idle, frozenset(gpus), start
        self.idle_since: float | None = None

    def look(
        self, now: float, samples: Samples, gpus: Collection[Gpu] | None = None
    ) -> tuple[str, str] | None:
        """(the guard, why) once one stops the run; None while none does. `gpus`: the run's
        GPUs now, where they changed (a host replaced under restart-job)."""
        if self.cost is not None:
            why = self.cost.reached(now - self.start)
            if why is not None:
                return COST, why
        if self.idle is None:
            return None
        found = utilizations(self.gpus if gpus is None else gpus, samples)
        self.idle_since = self.idle.since(self.idle_since, found, now)
        why = self.idle.reached(self.idle_since, now)
        return (GPU_IDLE, why) if why is not None else None

    def wants_gpus(self, host: str) -> bool:
        """Whether `host`'s GPU numbers count: the idle guard is on, a GPU there the run's."""
        return self.idle is not None and any(h == host for h, _ in self.gpus)

    def plan(self, now: float) -> dict[str, Any]:
        """The guards as a keeper's plan carries them (docs/PROTOCOL.md, `keep`): the cost as it
        stands `now`, from which the keeper goes on counting on its own clock."""
        found: dict[str, Any] = {}
        if self.cost is not None:
            spent = self.cost.spent(now - self.start)
            found[COST] = {
                "max_usd": self.cost.max_usd,
                "spent_usd": spent,
                "usd_per_hour": self.cost.usd_per_hour,
            }
        if self.idle is not None:
            found[GPU_IDLE] = {"below": self.idle.below, "minutes": self.idle.minutes}
        return found

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any], gpus: Collection[Gpu], start: float) -> Guards:
        """What `plan` wrote, read back by the keeper; ValueError names what is wrong."""
        cost = plan.get(COST)
        idle = plan.get(GPU_IDLE)
        return cls(
            CostCap(*_numbers(cost, COST, ("max_usd", "spent_usd", "usd_per_hour")))
            if cost is not None
            else None,
            GpuIdle(*_numbers(idle, GPU_IDLE, ("below", "minutes"))) if idle is not None else None,
            gpus,
            start,
        )


class GpuSamples:
    """Each host's last GPU sample as the keeper heard it from the wardens (warden.py), dated on
    the keeper's own clock by the age it came with. Its heartbeat thread notes, its judgment
    reads: hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, tuple[float, dict[int, float]]] = {}

    def note(self, host: str, said: Any, now: float) -> None:
        """A warden's `gpus`; one with no sample (none yet, no nvidia-smi) forgets the last."""
        sample = sample_of(said)
        age: Any = said.get("age") if isinstance(said, dict) else None
        with self.lock:
            if sample is not None and _number(age) and 0 <= float(age) < 3600:
                self.seen[host] = (now - float(age), sample)
            else:
                self.seen.pop(host, None)

    def fresh(self, now: float) -> dict[str, dict[int, float]]:
        """Each host's numbers, but those too old to say anything of now (GPU_STALE_S)."""
        with self.lock:
            seen = dict(self.seen)
        return {h: s for h, (at, s) in seen.items() if now - at <= GPU_STALE_S}


def utilizations(gpus: Collection[Gpu], samples: Samples) -> list[float] | None:
    """Every GPU of the run's utilization, or None when one has none (or the run has none)."""
    found = []
    for host, index in sorted(gpus):
        value = samples.get(host, {}).get(index)
        if value is None:
            return None
        found.append(value)
    return found or None


def sample_of(reply: Any) -> dict[int, float] | None:
    """A warden's `gpus` (warden.py), checked: GPU index -> utilization; None when it has none
    or is not one."""
    listed = reply.get("utilization") if isinstance(reply, dict) else None
    if not isinstance(listed, list):
        return None
    found: dict[int, float] = {}
    for pair in listed[:64]:
        if (
            isinstance(pair, list)
            and len(pair) == 2
            and _number(pair[0])
            and isinstance(pair[0], int)
            and _number(pair[1])
            and 0 <= pair[0] < 1024
            and 0 <= pair[1] <= 100
        ):
            found[int(pair[0])] = float(pair[1])
    return found


def usd(amount: float) -> str:
    """'$25.00' for dollars; below one, three significant digits ('$0.0413', '$0.00000005'):
    a spot price on a test's stand-in is fractions of a cent."""
    if 0 < amount < 1:
        text = f"{amount:.{2 - math.floor(math.log10(amount))}f}".rstrip("0")
        if float(text) < 1:
            return "$" + (text + "0" if len(text.partition(".")[2]) < 2 else text)
    return f"${amount:,.2f}"


def duration(seconds: float) -> str:
    """'30 min', '1 h 30 min', '45 s'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    hours, left = divmod(minutes, 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h" + (f" {left} min" if left else "")


def _number(value: Any) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok and math.isfinite(value)


def _numbers(table: Any, name: str, keys: Sequence[str]) -> list[float]:
    if not isinstance(table, dict) or not all(_number(table.get(k)) for k in keys):
        raise ValueError(f"guards.{name} needs the numbers {', '.join(keys)}")
    values = [float(table[k]) for k in keys]
    if any(v < 0 for v in values):
        raise ValueError(f"guards.{name}: no number may be negative")
    return values
