"""The report page's charts (deployer/api/reportpage.py): inline SVG, no script, no library.

One chart overlays a series per task, each in its own colour, over nice round axis ticks, with
vertical marks where an attempt or a restart began. A series is drawn from what `Line` kept of
it: records are streamed through it one at a time, bucketed by x (buckets of a power-of-two
width that doubles, the buckets merging pairwise, while there are more than the chart's
budget), and each bucket keeps its lowest and highest point in the order they came, so a
spike of one step among a million stays on the chart and a series is at most `2 x buckets`
points, whatever its length. A line is broken, never drawn across, where its x goes back (a
task resumed from an earlier checkpoint), where an attempt begins, and where consecutive x are
far apart next to the series' usual spacing (no records over a range). Numbers that are not
finite are skipped; every text is escaped (task and metric names came from hosts).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

W, H = 560, 220  # a chart's size in pixels
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 22, 30  # the plot's margins: tick labels, marks' labels
POINTS = 500  # what a chart draws of one series at most (its plot is 490 px wide)
CHART_POINTS = 2000  # of all its series together, so many tasks cost no more than a few
LEAST_POINTS = 60  # a series' share never less than this (128 tasks: 60 each)
GAP = 8.0  # a step to the next x this many times the usual spacing is a gap
DOTS = 120  # a series of at most this many points drawn gets a dot on each
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_FIRST_WIDTH = 2.0**-20  # a bucket's first width; it doubles as the series grows


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def colour(i: int) -> str:
    """The i-th task's colour: the ten of the palette, then hues spread by the golden angle."""
    if i < len(PALETTE):
        return PALETTE[i]
    return f"hsl({(i * 137.508) % 360:.0f},65%,42%)"


def share(tasks: int) -> int:
    """The points a series gets of a chart overlaying `tasks` series."""
    return max(LEAST_POINTS, min(POINTS, CHART_POINTS // max(1, tasks)))


@dataclass
class _Bucket:
    key: int  # floor(x / width) of its first point
    broken: bool  # the line breaks before it
    lo: tuple[int, float, float]  # (arrival, x, y) of its lowest point
    hi: tuple[int, float, float]  # and of its highest

    def take(self, other: _Bucket) -> None:
        if other.lo[2] < self.lo[2]:
            self.lo = other.lo
        if other.hi[2] >= self.hi[2]:  # a tie: the later (a flat run keeps its ends)
            self.hi = other.hi


@dataclass
class Line:
    """One series, streamed in: at most `points` points kept (see the module's doc)."""

    points: int = POINTS
    seen: int = 0  # points added, finite
    width: float = _FIRST_WIDTH
    buckets: list[_Bucket] = field(default_factory=list)
    _last: float | None = None  # x of the point before
    _spacing: float = 0.0  # the usual step between consecutive x (a moving average)
    _lo: float = math.inf
    _hi: float = -math.inf

    def add(self, x: float, y: float, brk: bool = False) -> None:
        """A point of the series; `brk`: the line breaks before it (an attempt began)."""
        if not (math.isfinite(x) and math.isfinite(y)):
            return
        last, self._last = self._last, x
        if last is not None:
            dx = x - last
            if dx < 0 or (self.seen >= 3 and dx > GAP * self._spacing > 0):
                brk = True
            elif dx > 0:
                self._spacing = dx if self._spacing == 0 else 0.9 * self._spacing + 0.1 * dx
        brk = brk and bool(self.buckets)
        self._lo, self._hi = min(self._lo, x), max(self._hi, x)
        point = (self.seen, x, y)
        self.seen += 1
        key = math.floor(x / self.width)
        current = self.buckets[-1] if self.buckets else None
        if current is not None and not brk and current.key == key:
            current.take(_Bucket(key, False, point, point))
            return
        self.buckets.append(_Bucket(key, brk, point, point))
        while len(self.buckets) > max(1, self.points // 2):
            self._coarser()

    def _coarser(self) -> None:
        """Buckets twice as wide: neighbours of one key merge, across a break only once the
        breaks alone are more than the buckets allowed (then they are too close to see)."""
        self.width *= 2
        breaks = sum(b.broken for b in self.buckets)
        keep_breaks = breaks < self.points // 4
        merged: list[_Bucket] = []
        for bucket in self.buckets:
            key = math.floor(bucket.lo[1] / self.width)  # its points' one key at this width
            top = merged[-1] if merged else None
            if top is not None and top.key == key and not (keep_breaks and bucket.broken):
                top.take(bucket)
            else:
                merged.append(_Bucket(key, bucket.broken, bucket.lo, bucket.hi))
        self.buckets = merged

    def segments(self) -> list[list[tuple[float, float]]]:
        """The points kept, as the unbroken runs of the line (in the order they came)."""
        runs: list[list[tuple[float, float]]] = []
        for bucket in self.buckets:
            pair = sorted({bucket.lo, bucket.hi})
            if bucket.broken or not runs:
                runs.append([])
            runs[-1].extend((x, y) for _, x, y in pair)
        return runs

    def span(self) -> tuple[float, float] | None:
        return (self._lo, self._hi) if self.seen else None


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten) from at or below `lo` to at or above
    `hi`, about `count` intervals apart; one value when the range is a point."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step((hi - lo) / max(1, count))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [_clean(i * step) for i in range(first, last + 1)]


def nice_step(raw: float) -> float:
    """The round step at or above `raw`: 1, 2, 2.5 or 5 times a power of ten."""
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * power * (1 + 1e-9):
            return m * power
    return 10.0 * power


def _clean(value: float) -> float:
    """A tick without the float noise of i x step (0.30000000000000004)."""
    return float(f"{value:.12g}") + 0.0  # + 0.0: no -0.0


def label(value: float, step: float) -> str:
    """A tick's label, as precise as the ticks' step needs: 250k, 1.5M, 0.25, 1e-05."""
    if value == 0:
        return "0"
    size = abs(value)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= scale and size >= 10_000:
            scaled = value / scale
            return (
                f"{scaled:.0f}" if scaled == round(scaled) else _fixed(scaled, step / scale)
            ) + suffix
    if size < 1e-3:
        return f"{value:.2g}"
    return _fixed(value, step)


def _fixed(value: float, step: float) -> str:
    decimals = max(0, min(6, -math.floor(math.log10(step) + 1e-9))) if step > 0 else 0
    if step > 0 and decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1  # a step of 2.5: one decimal more
    return f"{value:.{decimals}f}"


@dataclass(frozen=True)
class Mark:
    """A vertical mark at x: where an attempt (or one task's restart) began."""

    x: float
    text: str
    kind: str = "attempt"  # "attempt" or "restart"


@dataclass(frozen=True)
class Drawn:
    """One series of a chart: its task, colour and line."""

    task: str
    colour: str
    line: Line


def chart(
    metric: str,
    title: str,
    series: Sequence[Drawn],
    marks: Sequence[Mark],
    xlabel: str,
    fmt: Callable[[float, float], str] = label,
) -> str:
    """A figure: the chart of every task's series of `metric`, its legend, its marks."""
    attrs = f"class='chart' data-metric='{e(metric)}'"
    head = f"<figure class='metric'><figcaption>{e(title)}</figcaption>"
    drawn = [s for s in series if s.line.seen]
    if not drawn:
        empty = "<text x='10' y='25'>no data</text>"
        return f"{head}<svg {attrs} width='{W}' height='40'>{empty}</svg></figure>"
    segs = {s.task: s.line.segments() for s in drawn}
    xs = [x for s in drawn if (span := s.line.span()) for x in span]
    ys = [y for runs in segs.values() for run in runs for _, y in run]
    xt, yt = ticks(min(xs), max(xs)), ticks(min(ys), max(ys), 4)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    right, bottom = W - RIGHT, H - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (right - LEFT)

    def sy(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - TOP)

    xstep, ystep = xt[1] - xt[0], yt[1] - yt[0]
    grid = [
        f"<rect class='plot' x='{LEFT}' y='{TOP}' width='{right - LEFT}' height='{bottom - TOP}'/>"
    ]
    for t in xt:
        px = sx(t)
        grid.append(
            f"<line class='tick' x1='{px:.1f}' y1='{bottom}' x2='{px:.1f}' y2='{bottom + 4}'/>"
            f"<text class='xt' x='{px:.1f}' y='{bottom + 15}' text-anchor='middle'>"
            f"{e(label(t, xstep))}</text>"
        )
    for t in yt:
        py = sy(t)
        grid.append(
            f"<line class='grid' x1='{LEFT}' y1='{py:.1f}' x2='{right}' y2='{py:.1f}'/>"
            f"<text class='yt' x='{LEFT - 4}' y='{py + 3:.1f}' text-anchor='end'>"
            f"{e(fmt(t, ystep))}</text>"
        )
    grid.append(f"<text class='xl' x='{right}' y='{H - 2}' text-anchor='end'>{e(xlabel)}</text>")
    shown = [m for m in marks if x0 <= m.x <= x1]
    for i, m in enumerate(shown):
        px = sx(m.x)
        grid.append(
            f"<g class='mark {e(m.kind)}' data-x='{m.x:g}'><line x1='{px:.1f}' y1='{TOP - 4}' "
            f"x2='{px:.1f}' y2='{bottom}'/><text x='{px + 3:.1f}' y='{TOP - 8 + 10 * (i % 2)}'>"
            f"{e(m.text)}</text><title>{e(m.text)} at {e(xlabel)} {m.x:g}</title></g>"
        )
    paths = []
    for s in drawn:
        runs = segs[s.task]
        d = " ".join(
            "M" + " L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in run) for run in runs if run
        )
        count = sum(len(run) for run in runs)
        paths.append(
            f"<path class='series' data-task='{e(s.task)}' data-points='{count}' "
            f"data-segments='{len(runs)}' stroke='{s.colour}' d='{d}'/>"
        )
        if count <= DOTS:
            paths.append(
                f"<g class='dots' data-task='{e(s.task)}' fill='{s.colour}'>"
                + "".join(
                    f"<circle class='pt' cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='1.8'/>"
                    for run in runs
                    for x, y in run
                )
                + "</g>"
            )
    legend = "".join(
        f"<li data-task='{e(s.task)}'><span class='swatch' style='background:{s.colour}'>"
        f"</span>{e(s.task)}</li>"
        for s in drawn
    )
    return (
        f"{head}<svg {attrs} width='{W}' height='{H}' viewBox='0 0 {W} {H}'>"
        f"{''.join(grid)}{''.join(paths)}</svg><ul class='legend'>{legend}</ul></figure>"
    )


CSS = """
.charts{display:flex;flex-wrap:wrap;gap:14px}figure.metric{margin:0}
figcaption{font-size:13px;color:#333;font-weight:600}
svg.chart text{font-size:10px;fill:#555}.plot{fill:#fcfcfc;stroke:#bbb}
.grid{stroke:#eee}.tick{stroke:#999}path.series{fill:none;stroke-width:1.4}
.mark line{stroke:#c0392b;stroke-dasharray:4 3}.mark.restart line{stroke:#e67e22}
.mark text{fill:#c0392b!important}.mark.restart text{fill:#e67e22!important}
ul.legend{list-style:none;padding:0;margin:2px 0 0;display:flex;flex-wrap:wrap;gap:4px 12px;
font-size:11px;max-width:560px}.swatch{display:inline-block;width:12px;height:3px;
margin-right:4px;vertical-align:middle}
"""
