"""`sudo /opt/tfdeploy/venv/bin/python -m bench [--reps 3] [--sizes 1,8,32]`: the whole bench.

Brings up one namespace lab (100 hosts: 2 MB each), runs every scenario for every N with every
tool, several times, and prints one markdown table: medians with (min-max), ratios against the
baselines measured in the same run, and the issue's targets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from bench import report, workload
from bench.report import tee_to
from bench.streaming import PACED, StreamResult, stream, terminal_row
from bench.tools import (
    ANSIBLE_PLAYBOOK,
    Ansible,
    BenchError,
    Ctx,
    FabricLoop,
    PdshRsync,
    Tfdeploy,
    Tool,
    make_tmp,
    wire_bytes,
)
from tests.lab import start_lab

Sample = tuple[
    float, int | None, int
]  # seconds, code bytes per host (tool's own count), wire bytes per host


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--sizes", default="1,8,32", help="host counts (default 1,8,32)")
    p.add_argument("--reps", type=int, default=3, help="tfdeploy's repetitions per cell (3)")
    p.add_argument("--baseline-reps", type=int, default=2, help="the baselines' (2)")
    p.add_argument("--preflight-hosts", type=int, default=100)
    p.add_argument("--stream-seconds", type=float, default=10.0)
    p.add_argument("--tools", default="tfdeploy,ansible,pdsh,fabric")
    p.add_argument("--out", type=Path, help="also write the table to this file (docs/bench/)")
    return p.parse_args()


def _timed(lab, hosts, fn: Callable[..., int | None], *args: object) -> Sample:
    """Runs fn(*args) once: wall seconds, the tool's own code-byte count, wire bytes per host."""
    w0 = wire_bytes(lab, hosts)
    t0 = time.monotonic()
    code = fn(*args)
    seconds = time.monotonic() - t0
    w1 = wire_bytes(lab, hosts)
    wire = (w1 - w0) // len(hosts) if w0 >= 0 else -1
    return seconds, code, wire


def _cell_time(samples: list[Sample]) -> str:
    if not samples:
        return "-"
    ts = [s[0] for s in samples]
    return f"{statistics.median(ts):.2f} s ({min(ts):.2f}-{max(ts):.2f})"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _cell_bytes(samples: list[Sample]) -> str:
    if not samples:
        return "-"
    wire = statistics.median(s[2] for s in samples)
    code = [s[1] for s in samples if s[1] is not None]
    own = f"{_fmt_bytes(statistics.median(code))} code, " if code else ""
    return f"{own}{_fmt_bytes(wire)} wire" if wire >= 0 else own.rstrip(", ")


def _median(samples: list[Sample]) -> float:
    return statistics.median(s[0] for s in samples) if samples else float("nan")


def main() -> int:
    args = _args()
    with tee_to(args.out, "bench"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("the bench needs root (namespace lab): sudo /opt/tfdeploy/venv/bin/python -m bench")
        return 2
    sizes = [int(s) for s in args.sizes.split(",")]
    wanted = args.tools.split(",")
    missing = [
        t
        for t, ok in (("ansible", ANSIBLE_PLAYBOOK.exists()), ("pdsh", bool(shutil.which("pdsh"))))
        if t in wanted and not ok
    ]
    if missing:
        print(
            f"missing baseline tools: {missing}. Install them (Ansible in its own venv, not the "
            "project's): /usr/bin/python3 -m venv /opt/tfdeploy/bench-venv && "
            "/opt/tfdeploy/bench-venv/bin/pip install ansible-core; apt-get install pdsh rsync"
            " - or leave them out with --tools"
        )
        return 2
    started = time.monotonic()
    load_before = report.load()
    report.compile_tfdeploy()
    tmp = make_tmp()
    small = workload.small_tree(tmp / "code5")
    big = workload.big_tree(tmp / "code50")
    lab = start_lab(max([*sizes, args.preflight_hosts]))
    ctx = Ctx(lab, tmp)
    classes: dict[str, type[Tool]] = {
        "tfdeploy": Tfdeploy,
        "ansible": Ansible,
        "pdsh": PdshRsync,
        "fabric": FabricLoop,
    }
    tools = [classes[t](ctx) for t in wanted]
    res: dict[tuple[str, str, int], list[Sample]] = defaultdict(list)
    streams: dict[str, tuple[float, StreamResult]] = {}
    try:
        for n in sizes:
            hosts = lab.hosts[:n]
            for tool in tools:
                reps = args.reps if isinstance(tool, Tfdeploy) else args.baseline_reps
                print(
                    f"[{time.monotonic() - started:5.0f} s] N={n} {tool.name}",
                    file=sys.stderr,
                    flush=True,
                )
                for _ in range(reps):  # cold deploy, then down of what it started
                    tool.reset(hosts)
                    res["cold", tool.name, n].append(_timed(lab, hosts, tool.deploy, hosts, small))
                    res["down", tool.name, n].append(_timed(lab, hosts, tool.down, hosts))
                for _ in range(reps):  # warm: same tree again, tasks stopped first
                    res["warm", tool.name, n].append(_timed(lab, hosts, tool.deploy, hosts, small))
                    tool.reset(hosts, keep_files=True)
                tool.reset(hosts)
                tool.deploy(hosts, big)  # untimed: the 50 MB tree is there before the edit
                for gen in range(reps):
                    tool.reset(hosts, keep_files=True)
                    workload.change_one(big, gen)
                    res["change", tool.name, n].append(_timed(lab, hosts, tool.deploy, hosts, big))
                tool.reset(hosts)
                workload.change_one(big, -1)
            if "tfdeploy" in wanted:
                tf = next(t for t in tools if isinstance(t, Tfdeploy))
                tf.preflight(hosts, small)  # agent installed: steady state
                for _ in range(args.reps):
                    res["preflight", "tfdeploy", n].append(
                        _timed(lab, hosts, tf.preflight, hosts, small)
                    )
        if "tfdeploy" in wanted:
            tf = next(t for t in tools if isinstance(t, Tfdeploy))
            many = lab.hosts[: args.preflight_hosts]
            print(
                f"[{time.monotonic() - started:5.0f} s] preflight on {len(many)} hosts",
                file=sys.stderr,
                flush=True,
            )
            tf.preflight(many, small)
            for _ in range(max(args.reps, 5)):
                res["preflight", "tfdeploy", len(many)].append(
                    _timed(lab, many, tf.preflight, many, small)
                )
            print(
                f"[{time.monotonic() - started:5.0f} s] log streaming", file=sys.stderr, flush=True
            )
            eight = lab.hosts[:8]
            runs = {"short": (args.stream_seconds / 3, 0), "flat": (args.stream_seconds, 0)}
            runs["paced"] = (args.stream_seconds, PACED)
            for key, (seconds, rate) in runs.items():
                streams[key] = (seconds, stream(tf, eight, small, seconds, rate))
                tf.reset(eight, keep_files=True)
            terminal = stream(tf, eight, small, args.stream_seconds, PACED, terminal=True)
            streams["terminal"] = (args.stream_seconds, terminal)
            tf.reset(eight, keep_files=True)
    finally:
        for tool in tools:
            if isinstance(tool, Ansible):
                tool.close()
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(_table(res, streams, sizes, [t.name for t in tools], args))
    print(
        f"\nMachine: {report.machine()}. "
        f"Load average before/after: {load_before} / {report.load()}. "
        f"Bench wall time {elapsed / 60:.1f} min; {args.reps} repetitions per tfdeploy cell, "
        f"{args.baseline_reps} per baseline cell (preflight on {args.preflight_hosts} hosts: "
        f"{max(args.reps, 5)}), "
        "median (min-max)."
    )
    return 0


def _table(res, streams, sizes, names, args) -> str:
    base = [n for n in names if n != "tfdeploy"]
    head = [
        "scenario",
        "N",
        *names,
        *(f"tfdeploy ÷ {b}" for b in base if b != "fabric loop"),
        "target",
        "met",
    ]
    rows = [head, ["---"] * len(head)]
    tf = lambda s, n: _median(res[s, "tfdeploy", n])  # noqa: E731
    big_n = max(sizes)

    def ratio_cells(s: str, n: int) -> list[str]:
        return [
            f"{tf(s, n) / _median(res[s, b, n]):.2f}x"
            if res[s, b, n] and res[s, "tfdeploy", n]
            else "-"
            for b in base
            if b != "fabric loop"
        ]

    def verdict(ok: bool) -> str:
        return "yes" if ok else "**no**"

    for s, label in (
        ("cold", "cold deploy 5 MB / 500 files + start"),
        ("warm", "warm re-deploy (nothing changed)"),
        ("change", "one 1 MB file changed in 50 MB"),
        ("down", "down until every task is gone"),
    ):
        for n in sizes:
            target, met = "", ""
            if s == "cold" and n == big_n:
                r = [
                    tf(s, n) / _median(res[s, b, n])
                    for b in ("ansible", "pdsh+rsync")
                    if res[s, b, n]
                ]
                own = tf(s, n) / tf(s, sizes[0])
                target = f"<= 0.5x Ansible and pdsh+rsync; <= 3x own N={sizes[0]} ({own:.1f}x)"
                met = verdict(all(x <= 0.5 for x in r) and own <= 3)
            if s == "warm" and n == big_n and res["preflight", "tfdeploy", n]:
                pf = tf(s, n) / _median(res["preflight", "tfdeploy", n])
                code = max(x[1] or 0 for x in res[s, "tfdeploy", n])
                target = f"0 code bytes ({code}); <= 1.5x bare preflight ({pf:.1f}x)"
                met = verdict(code == 0 and pf <= 1.5)
            if s == "down" and n == big_n:
                target, met = (
                    "<= 2 s (+ grace: unused, sleep ends on SIGTERM)",
                    verdict(tf(s, n) <= 2),
                )
            rows.append(
                [
                    label,
                    str(n),
                    *(_cell_time(res[s, t, n]) for t in names),
                    *ratio_cells(s, n),
                    target,
                    met,
                ]
            )
        if s in ("cold", "warm", "change"):
            for n in sizes:
                target, met = "", ""
                if s == "change" and n == big_n:
                    code = (
                        max(x[1] or 0 for x in res[s, "tfdeploy", n])
                        if res[s, "tfdeploy", n]
                        else 0
                    )
                    target, met = "<= 1.2 MB code per host", verdict(code <= 1.2e6)
                rows.append(
                    [
                        f"{label}: bytes per host",
                        str(n),
                        *(_cell_bytes(res[s, t, n]) for t in names),
                        *([""] * (len(head) - len(names) - 4)),
                        target,
                        met,
                    ]
                )
    for n in sorted({k[2] for k in res if k[0] == "preflight"}):
        target, met = "", ""
        if n >= 100:
            target, met = "<= 1.5 s", verdict(tf("preflight", n) <= 1.5)
        rows.append(
            [
                "preflight alone",
                str(n),
                _cell_time(res["preflight", "tfdeploy", n]),
                *([""] * (len(head) - 5)),
                target,
                met,
            ]
        )
    if streams:
        rows += _stream_rows(streams, len(head))
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _stream_rows(streams: dict[str, tuple[float, StreamResult]], width: int) -> list[list[str]]:
    """Throughput and memory from the flat-out runs, latency from the paced run."""
    (short_s, short), (flat_s, flat), (_, paced), (_, terminal) = (
        streams["short"],
        streams["flat"],
        streams["paced"],
        streams["terminal"],
    )
    grow = flat.peak_rss_mb / short.peak_rss_mb if short.peak_rss_mb else 0.0
    plain = [r for key, (_, r) in streams.items() if key != "terminal"]
    every = all(r.complete for r in plain)
    lost = "; ".join(r.detail for r in plain if not r.complete)

    def cell(r: StreamResult) -> str:
        return (
            f"{r.rate:,.0f} lines/s shown; latency median {r.median_ms:,.0f} ms, "
            f"p99 {r.p99_ms:,.0f} ms; controller peak RSS {r.peak_rss_mb:.0f} MB; "
            f"{r.lines:,} lines, " + ("all accounted for" if r.complete else "LOST: " + r.detail)
        )

    pad = [""] * (width - 5)
    tty_row = terminal_row(paced, terminal, flat_s)
    flat_ok = flat.rate >= 50_000 and grow <= 1.25 and every
    return [
        [
            f"log streaming: 8 tasks print flat out for {flat_s:g} s (plain mode)",
            "8",
            cell(flat) + f" (a separate {short_s:.1f} s run: peak RSS {short.peak_rss_mb:.0f} MB)",
            *pad,
            ">= 50k lines/s; memory bounded (not growing with lines)",
            "yes" if flat_ok else "**no**" + (f" ({lost})" if lost else ""),
        ],
        [
            f"log streaming: 8 tasks x {PACED:,} lines/s for {flat_s:g} s (plain mode)",
            "8",
            cell(paced),
            *pad,
            "median latency <= 300 ms",
            "yes" if paced.median_ms <= 300 and paced.complete else "**no**",
        ],
        [*tty_row[:3], *pad, *tty_row[3:]],
    ]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)
