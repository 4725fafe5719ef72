"""Regenerates docs/live-view.svg from a real `up` (default inventory: inventories/local.toml).

It runs the real deployment and, once a log line containing WHEN arrived (default
`test_accuracy`), snapshots the live view's own renderables (prefixed log lines over the task
table, folded as on a terminal of ROWS lines, and the status line) into an SVG with rich's
exporter.

    python scripts/live_view_svg.py [INVENTORY] [OUT.svg] [--when TEXT] [--rows ROWS]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console, Group
from rich.text import Text

from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.board import TaskRow
from deployer.watch.table import Heard, region_rows, task_panel
from deployer.watch.view import PlainView, prefixed

ROOT = Path(__file__).resolve().parent.parent


class SnapshotView(PlainView):
    """Prints plainly, and keeps the screen a LiveView would show at the most eventful moment."""

    def __init__(self, when: str) -> None:
        super().__init__(sys.stdout)
        self.when = when
        self.log: list[tuple[str, str]] = []
        self.status = ""
        self.heard: dict[str, float] = {}
        self.said: dict[str, int] = {}
        self.snapshot: tuple[list[tuple[str, str]], Sequence[TaskRow], Heard, str] | None = None

    def step(self, text: str) -> None:
        super().step(text)
        self.status = text.partition("\n")[0]

    def lines(self, label: str, lines: Sequence[str]) -> None:
        super().lines(label, lines)
        self.log += [(label, line) for line in lines]
        task = label.partition(" ")[0]
        self.heard[task] = time.monotonic()
        self.said[task] = self.said.get(task, 0) + len(lines)

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        status = self.status
        super().tasks(rows)  # its state lines are steps of a pipe, not of the status line
        self.status = status
        for row in rows:
            self.heard.setdefault(row.label, time.monotonic())
        if self.snapshot is None and any(self.when in line for _, line in self.log[-200:]):
            heard = Heard(dict(self.heard), dict(self.said), time.monotonic())
            self.snapshot = (list(self.log[-14:]), list(rows), heard, self.status)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("inventory", nargs="?", type=Path, default=ROOT / "inventories/local.toml")
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "docs" / "live-view.svg")
    parser.add_argument("--when", default="test_accuracy", help="snapshot after a line with it")
    parser.add_argument("--rows", type=int, default=40, help="the terminal's lines")
    args = parser.parse_args(argv)
    plan = make_plan(load_inventory(args.inventory))
    view = SnapshotView(args.when)
    with Fleet(plan.hosts) as fleet:
        code = Deployment(plan, fleet, view, UpOptions()).run()
    if view.snapshot is None:
        print(f"no snapshot: the job printed no line with {args.when!r}", file=sys.stderr)
        return 1
    log, rows, heard, status = view.snapshot
    console = Console(record=True, width=118, file=io.StringIO(), force_terminal=True)
    width = max(len(label) for label, _ in log)
    for label, line in log:
        console.print(prefixed(label, line, width), soft_wrap=False, overflow="ellipsis")
    now = max((r.ended or 0) for r in rows) or None
    panel = task_panel(rows, region_rows(args.rows) - 1, heard, now)
    console.print(Group(*panel, Text(f"tfdeploy: {status}", style="bold")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(args.out), title=f"tfdeploy up {args.inventory.name}")
    print(f"wrote {args.out} (job exit status {code})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
