"""A hello that fails on the host after it reserved the run's ports drops them itself (issue
58): its `up` gets an ok:false reply, holds no reservation it knows of, and releases nothing, so
the ports stayed reserved for a minute and the next `up` was refused. The real agent, driven
over stdin as the control side drives it (test_agent_bounds.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.support.agent import AGENT, PYTHON, ok


def call(workdir: Path, op: str, **params: Any) -> dict[str, Any]:
    request = {"v": 1, "op": op, "workdir": str(workdir), **params}
    proc = subprocess.run(
        [PYTHON, str(AGENT)], input=json.dumps(request).encode(), capture_output=True, timeout=30
    )
    reply: dict[str, Any] = json.loads(proc.stdout)
    return reply


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


def test_a_hello_that_fails_after_reserving_leaves_no_reservation(workdir: Path) -> None:
    port = free_port()
    # The interpreters query is answered after the reservation: a word that is no string
    # fails the hello there.
    bad = {"python": PYTHON, "words": [1]}
    failed = call(
        workdir, "hello", ports=[port], run_id="first", lease_seconds=30, interpreters=bad
    )
    assert failed["ok"] is False and "interpreters.words" in failed["error"], failed
    assert list(workdir.glob("hosts/*/ports/*.json")) == []
    other = ok(call(workdir, "hello", ports=[port], run_id="second", lease_seconds=30))
    assert other["busy_ports"] == [] and other["reserved_by"] == {}
    assert ok(call(workdir, "release", run_id="second"))["released"] == 1


def test_a_hello_refused_for_a_busy_port_keeps_the_other_runs_reservation(workdir: Path) -> None:
    """What a failed hello drops is its own: one that found the port busy reserved nothing,
    and the holder's reservation stays."""
    port = free_port()
    ok(call(workdir, "hello", ports=[port], run_id="first", lease_seconds=30))
    bad = {"python": PYTHON, "words": [1]}
    failed = call(
        workdir, "hello", ports=[port], run_id="second", lease_seconds=30, interpreters=bad
    )
    assert failed["ok"] is False
    third = ok(call(workdir, "hello", ports=[port], run_id="third", lease_seconds=30))
    assert third["reserved_by"] == {str(port): "first"}
