"""bench.env reads its phases from output lines: a pattern that no longer matches tfdeploy's or
the programs' lines would leave its columns empty (or worse, measure the wrong line)."""

from __future__ import annotations

import time

import pytest

from bench.env import Cell, durations, parse_cells
from bench.env_arms import BusyTrace, Sample, task_marks, tfdeploy_phases
from bench.tools import BenchError


def test_the_phases_come_from_tfdeploys_lines() -> None:
    lines = [
        (1.0, "tfdeploy: preflight ok: python 3.11.2"),
        (3.0, "tfdeploy: environment 0123456789ab for h1, h2: CPython 3.11, 7 wheels, 9 bytes"),
        (3.5, "tfdeploy: environment fedcba987654 for h3: CPython 3.9, 7 wheels, 9 bytes"),
        (6.0, "tfdeploy: pushed 12 files to 3 hosts: 9 bytes sent from here (run x)"),
        (9.0, "tfdeploy: environment built on h1 (uv, 2.0 s), h2 (uv, 2.1 s)"),
        (9.5, "tfdeploy: environment reused on h3"),
        (10.0, "tfdeploy: starting worker:0, worker:1, worker:2"),
    ]
    assert tfdeploy_phases(lines) == {"preflight": 1.0, "resolve": 3.5, "send": 6.0, "install": 9.5}


def test_every_task_must_print_its_first_step() -> None:
    a = [(1.0, "tfdeploy-env TF_CONFIG=..."), (4.0, "worker:0: first step done")]
    b = [(2.0, "tfdeploy-env TF_CONFIG=..."), (3.0, "worker:1: first step done")]
    assert task_marks([a, b], 2) == {"running": 2.0, "first": 4.0}
    with pytest.raises(BenchError, match="first step done"):
        task_marks([a, b[:1]], 2)


def test_a_phase_not_seen_counts_in_the_next() -> None:
    s = Sample(phases={"preflight": 1.0, "send": 4.0, "running": 5.0, "first": 7.5})
    assert durations(s) == [1.0, None, 3.0, None, 1.0, 2.5]


def test_cells_name_a_set_and_a_host_count() -> None:
    assert parse_cells("small@1,capped:tf@4") == [Cell("small", 1, False), Cell("tf", 4, True)]
    with pytest.raises(BenchError, match="bad cell"):
        parse_cells("huge@4")


def test_the_cpu_column_reads_the_machines_busy_seconds_up_to_a_time() -> None:
    began = time.monotonic()
    with BusyTrace(began) as trace:
        spin_until = began + 0.6
        while time.monotonic() < spin_until:  # one core busy: the machine's busy time grows
            pass
    burned = trace.at(time.monotonic() - began)
    assert burned is not None and burned >= 0.4, trace.samples
    assert trace.at(0.0) == 0.0 and trace.at(None) is None
