"""The peak-RSS measurement the glibc test relies on (tests/support/peak_rss.py): a measured
command's peak is its own, however large the measuring process has grown. A plain fork+exec
from a 300 MB process reports 300 MB for `/bin/true`; that read 287 MB in a full run."""

from __future__ import annotations

import os
import sys

from tests.support.peak_rss import measured


def test_a_large_measuring_process_does_not_count_in_the_commands_peak() -> None:
    grown = bytearray(300 << 20)
    grown[::4096] = b"\x01" * len(grown[::4096])  # touched: resident, as a grown worker's heap
    run = measured([sys.executable, "-c", "print('small')"], dict(os.environ))
    del grown
    assert run.returncode == 0 and run.output.strip() == "small", run
    assert run.rss_kib < 100 * 1024, f"{run.rss_kib // 1024} MB: the parent's size leaked in"


def test_the_commands_own_growth_is_measured_and_its_exit_status_kept() -> None:
    run = measured(
        [
            sys.executable,
            "-c",
            "b = bytearray(150 << 20); b[::4096] = b'1' * len(b[::4096]); raise SystemExit(3)",
        ],
        dict(os.environ),
    )
    assert run.returncode == 3
    assert run.rss_kib > 150 * 1024, f"{run.rss_kib // 1024} MB"
