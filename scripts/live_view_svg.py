"""Regenerates docs/live-view.svg from a real `up` (default inventory: inventories/local.toml).

It runs the real deployment and, once the job has produced some output, snapshots the live view's
own renderables (prefixed log lines over the task table) into an SVG with rich's exporter.

    python scripts/live_view_svg.py [INVENTORY] [OUT.svg]
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from deployer.config.plan import make_plan
from deployer.hosts.fleet import Fleet
from deployer.sources import load_inventory
from deployer.up.deployment import Deployment, UpOptions
from deployer.watch.board import TaskRow
from deployer.watch.table import task_table
from deployer.watch.view import PlainView, prefixed

ROOT = Path(__file__).resolve().parent.parent


class SnapshotView(PlainView):
    """Prints plainly, and keeps the screen a LiveView would show at the most eventful moment."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.log: list[tuple[str, str]] = []
        self.rows: Sequence[TaskRow] = ()
        self.snapshot: tuple[list[tuple[str, str]], Sequence[TaskRow]] | None = None

    def lines(self, label: str, lines: Sequence[str]) -> None:
        super().lines(label, lines)
        self.log += [(label, line) for line in lines]

    def tasks(self, rows: Sequence[TaskRow]) -> None:
        super().tasks(rows)
        self.rows = list(rows)
        if any("test_accuracy" in line for _, line in self.log) and self.snapshot is None:
            self.snapshot = (list(self.log[-14:]), self.rows)


def main(argv: list[str]) -> int:
    inventory = Path(argv[0]) if argv else ROOT / "inventories" / "local.toml"
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "live-view.svg"
    plan = make_plan(load_inventory(inventory))
    view = SnapshotView()
    with Fleet(plan.hosts) as fleet:
        code = Deployment(plan, fleet, view, UpOptions()).run()
    if view.snapshot is None:
        print("no snapshot: the job produced no test_accuracy line", file=sys.stderr)
        return 1
    log, rows = view.snapshot
    console = Console(record=True, width=118, file=io.StringIO(), force_terminal=True)
    width = max(len(label) for label, _ in log)
    for label, line in log:
        console.print(prefixed(label, line, width), soft_wrap=False, overflow="ellipsis")
    console.print(task_table(rows, now=max((r.ended or 0) for r in rows) or None))
    out.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(out), title=f"tfdeploy up {inventory.name}")
    print(f"wrote {out} (job exit status {code})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
