"""`python -m bench.linefilter [--mb 50] [--reps 5] [--baseline FILE] [--out FILE]`

The output filter's cost (deployer/core/lines.py, LineAssembler.feed): a task's log bytes in
1 MiB chunks, as `logs` and `up` feed them, to clean display lines. Three logs: plain ASCII
(the common case, the fast path), ASCII with typographic UTF-8 (en dashes, quotes, accents,
whose lead bytes the invisible characters share), and a log where one line in 50 carries an
escape sequence or an invisible character. With `--baseline` (another copy of lines.py, e.g.
`git show REV:deployer/core/lines.py > /tmp/lines_before.py`) both run alternately, and the
table gives each one's MB/s and the ratio. No lab, no root: all in this process.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from bench import report
from deployer.core import lines as current

MB = 1 << 20
LINE = "2026-11-28 10:00:00.123456: I tensorflow/core/step.cc:42] step 1234 loss=0.4321 acc=0.9\n"
TYPOGRAPHIC = "Epoch 3/10 – “val_loss” improved from 0.51 to 0.48 … saving to ckpt/é ±1 °C\n"
HOSTILE = "x\x1b[31mred\x1b[0m \u202egnp.exe\u202c zero\u200bwidth \u2028 sep\n"


def _log(kind: str, size: int) -> bytes:
    if kind == "plain ASCII":
        block = LINE * 50
    elif kind == "typographic UTF-8":
        block = (LINE * 9 + TYPOGRAPHIC) * 5
    else:
        block = LINE * 49 + HOSTILE
    data = block.encode()
    return (data * (size // len(data) + 1))[:size]


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("lines_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(make: Callable[[], object], data: bytes) -> float:
    assembler = make()
    view = memoryview(data)
    began = time.perf_counter()
    for at in range(0, len(data), MB):
        assembler.feed(bytes(view[at : at + MB]))  # type: ignore[attr-defined]
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linefilter")
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another lines.py to compare with")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    arms = {"this tree": current}
    if args.baseline:
        arms = {"baseline": _load(args.baseline), **arms}
    kinds = ["plain ASCII", "typographic UTF-8", "1 hostile line in 50"]
    times: dict[tuple[str, str], list[float]] = {}
    for kind in kinds:
        data = _log(kind, args.mb * MB)
        for _ in range(1 + args.reps):  # the first round is not timed (caches, allocator)
            for name, module in arms.items():
                times.setdefault((kind, name), []).append(_time(module.LineAssembler, data))
    with report.tee_to(args.out, "bench.linefilter"):
        _print(args, kinds, list(arms), times)
    return 0


def _print(
    args: argparse.Namespace,
    kinds: list[str],
    arms: list[str],
    times: dict[tuple[str, str], list[float]],
) -> None:
    print(
        f"LineAssembler.feed over a {args.mb} MB log in 1 MiB chunks; medians of {args.reps} "
        f"runs after one untimed run, arms alternating; {report.machine()}; load average "
        f"{report.load()}.\n"
    )
    print("| log | arm | median | MB/s | ÷ baseline |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        first = statistics.median(times[(kind, arms[0])][1:])
        for name in arms:
            median = statistics.median(times[(kind, name)][1:])
            ratio = f"{median / first:.2f}x" if len(arms) > 1 else "-"
            print(f"| {kind} | {name} | {median:.3f} s | {args.mb / median:.0f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
