"""Each task's progress and resources over time, as the controller collects them while it
watches: the metrics records the task wrote (TFDEPLOY_METRICS, parsed at the reply edge) and
the CPU/RSS (and GPU) samples of its host. Bounded: MAX_POINTS points per series, halved by
keeping every other point when full (the newest always kept), so a week-long run costs the
same memory as an hour's. What a view and `status` show of it is a `TaskProgress`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from deployer.core.text import duration, human_size

MAX_POINTS = 4096
RATE_WINDOW_S = 30.0  # steps/s over the records of the last this many seconds
SPARK = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 12


@dataclass(frozen=True)
class TaskProgress:
    """What one task's row shows: plain values, None where unknown."""

    step: int | None = None
    total_steps: int | None = None
    rate: float | None = None  # steps per second
    eta_s: float | None = None
    loss: float | None = None
    cpu: float | None = None  # percent of one core
    rss: int | None = None  # bytes
    gpu_util: float | None = None  # percent, the task's GPUs averaged
    gpu_mem: float | None = None  # GiB used on the task's GPUs
    loss_spark: str = ""
    rate_spark: str = ""
    cpu_spark: str = ""

    def step_text(self) -> str:
        if self.step is None:
            return "-"
        return f"{self.step}/{self.total_steps}" if self.total_steps else str(self.step)

    def rate_text(self) -> str:
        return "-" if self.rate is None else f"{self.rate:.3g}"

    def eta_text(self) -> str:
        return "-" if self.eta_s is None else duration(self.eta_s)

    def loss_text(self) -> str:
        return "-" if self.loss is None else f"{self.loss:.4g}"

    def cpu_text(self) -> str:
        return "-" if self.cpu is None else f"{self.cpu:.0f}%"

    def rss_text(self) -> str:
        return "-" if self.rss is None else human_size(self.rss)

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "steps_per_s": None if self.rate is None else round(self.rate, 4),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "loss": self.loss,
            "cpu_percent": self.cpu,
            "rss_bytes": self.rss,
            "gpu_util_percent": self.gpu_util,
            "gpu_mem_gib": self.gpu_mem,
        }


def _thin(points: list[dict[str, float]]) -> None:
    if len(points) > MAX_POINTS:
        last = points[-1]
        del points[::2]
        if points[-1] is not last:
            points.append(last)


@dataclass
class TaskSeries:
    """One task's records and resource samples; `offset`: how far its metrics file was read."""

    offset: int = 0
    records: list[dict[str, float]] = field(default_factory=list)
    resources: list[dict[str, float]] = field(default_factory=list)  # t, cpu, rss, gpu_*

    def add_records(self, records: tuple[dict[str, float], ...], now: float) -> None:
        for record in records:
            self.records.append({"time": now, **record} if "time" not in record else record)
        _thin(self.records)

    def add_sample(self, now: float, **values: float | None) -> None:
        sample = {"t": now, **{k: v for k, v in values.items() if v is not None}}
        if len(sample) > 1:
            self.resources.append(sample)
            _thin(self.resources)

    @property
    def seen(self) -> bool:
        return bool(self.records or self.resources)

    def progress(self) -> TaskProgress:
        last = self.records[-1] if self.records else {}
        sample = self.resources[-1] if self.resources else {}
        step = int(last["step"]) if "step" in last else None
        total = next(
            (int(r["total_steps"]) for r in reversed(self.records[-8:]) if "total_steps" in r),
            None,
        )
        rate = self._rate()
        eta = (total - step) / rate if rate and total and step is not None else None
        return TaskProgress(
            step=step,
            total_steps=total,
            rate=rate,
            eta_s=None if eta is None else max(0.0, eta),
            loss=last.get("loss"),
            cpu=sample.get("cpu"),
            rss=int(sample["rss"]) if "rss" in sample else None,
            gpu_util=sample.get("gpu_util"),
            gpu_mem=sample.get("gpu_mem"),
            loss_spark=spark([r["loss"] for r in self.records if "loss" in r]),
            rate_spark=spark(self._rates()),
            cpu_spark=spark([s["cpu"] for s in self.resources if "cpu" in s]),
        )

    def _rate(self) -> float | None:
        if len(self.records) < 2:
            return None
        end = self.records[-1]
        start = next(
            (r for r in self.records if end["time"] - r["time"] <= RATE_WINDOW_S), self.records[0]
        )
        if start is end:
            start = self.records[-2]
        spent = end["time"] - start["time"]
        steps = end["step"] - start["step"]
        return steps / spent if spent > 0 and steps >= 0 else None

    def _rates(self) -> list[float]:
        recent = self.records[-(SPARK_POINTS + 1) :]
        return [
            (b["step"] - a["step"]) / (b["time"] - a["time"])
            for a, b in itertools.pairwise(recent)
            if b["time"] > a["time"] and b["step"] >= a["step"]
        ]


def spark(values: list[float]) -> str:
    """The last SPARK_POINTS values as a sparkline ('▁▃▅█'): a trend at a glance."""
    shown = values[-SPARK_POINTS:]
    if len(shown) < 2:
        return ""
    low, high = min(shown), max(shown)
    span = high - low
    if span <= 0:
        return SPARK[0] * len(shown)
    return "".join(SPARK[min(7, int((v - low) / span * 8))] for v in shown)
