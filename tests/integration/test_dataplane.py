"""Bulk bytes on real hosts (issue #25): what a pull does when it is interrupted, when the file
changes under it and when the host's key is unknown; the bytes' speed is bench/dataplane.py's.

Push and pull through a jump host with strict keys: tests/integration/test_results.py
(`test_pull_and_tunnel_through_a_bastion`); an unknown key refused before any push:
tests/integration/test_security.py; a 1 GB file with bounded memory: tests/unit/test_bulk_memory.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

MB = 1 << 20
# The task writes SIZE bytes of random data, says so, then keeps running (or rewrites the file
# in place forever with "churn", so a pull always sees it change).
WRITE = """\
import hashlib, os, sys, time
size = int(sys.argv[1])
data = os.urandom(size)
with open("big.bin", "wb") as f:
    f.write(data)
print("wrote", hashlib.sha256(data).hexdigest(), flush=True)
while True:
    if sys.argv[2] == "churn":
        with open("big.bin", "r+b") as f:
            f.write(os.urandom(4096))
    time.sleep(0.05)
"""


def _env(state: Path) -> dict[str, str]:
    return os.environ | {"TFDEPLOY_STATE_DIR": str(state)}


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[str]]:
    """Run ids to stop after the test, whatever happened in it (before clean_lab looks)."""
    started: list[str] = []
    yield started
    for run_id in started:
        tfdeploy("down", run_id, state=tmp_path / "state")


def _detached(
    lab_inventory: Any, tmp_path: Path, size: int, mode: str, runs: list[str]
) -> tuple[Path, str, str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "write.py").write_text(WRITE)
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "bulk", "command": f"python3 write.py {size} {mode}", "stop_grace": 1},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("tfdeploy down ")[1].split("`")[0]
    runs.append(run_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = tfdeploy("logs", run_id, state=tmp_path / "state")
        if "wrote " in logs.stdout:
            digest = logs.stdout.split("wrote ")[1].split()[0]
            return inventory, run_id, digest
        time.sleep(0.5)
    raise AssertionError("the task never wrote its file")


def test_a_pull_interrupted_mid_file_keeps_its_part_and_resumes(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Ctrl-C mid-transfer: exit 130 at once, the partial file is kept as `.part` (never taken
    for the content), nothing of the pull runs on the host; the next pull fetches the rest."""
    size = 96 * MB
    _, run_id, digest = _detached(lab_inventory, tmp_path, size, "keep", runs)
    host = clean_lab.hosts[0]
    home = tmp_path / "home"
    clean_lab.cap_bandwidth(host, "80mbit")  # ~10 MB/s: the pull takes ~10 s
    try:
        pull = subprocess.Popen(
            [sys.executable, "-m", "deployer", "pull", run_id, "big.bin", "--to", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(tmp_path / "state"),
        )
        parts: list[Path] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(p.stat().st_size > 8 * MB for p in parts):
            time.sleep(0.1)
            parts = list(home.rglob("*.part"))
        assert parts, "the pull never started writing"
        pull.send_signal(signal.SIGINT)
        began = time.monotonic()
        out, _ = pull.communicate(timeout=30)
        assert pull.returncode == 130, out
        assert time.monotonic() - began < 5, "Ctrl-C must stop a transfer at once"
    finally:
        clean_lab.uncap_bandwidth(host)
    [part] = home.rglob("*.part")
    kept = part.stat().st_size
    assert 0 < kept < size and not (part.parent / "big.bin").exists()
    time.sleep(1)
    agents = clean_lab.run(host, "pgrep -af '[a]gent.py serve' || true").stdout
    assert "serve" not in agents, f"a pull's agent is still running: {agents}"
    again = tfdeploy("pull", run_id, "big.bin", "--to", str(home), state=tmp_path / "state")
    assert again.returncode == 0, again.stdout + again.stderr
    sent = int(again.stdout.split("pulled 1 file into")[1].split(": ")[1].split(" bytes")[0])
    assert sent == size - kept  # only the rest travelled
    pulled = home / run_id / "worker-0" / "big.bin"
    assert hashlib.sha256(pulled.read_bytes()).hexdigest() == digest
    assert not list(home.rglob("*.part"))


def test_a_file_that_changes_while_pulled_is_named_and_not_kept(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    _, run_id, _ = _detached(lab_inventory, tmp_path, 8 * MB, "churn", runs)
    home = tmp_path / "home"
    pulled = tfdeploy("pull", run_id, "big.bin", "--to", str(home), state=tmp_path / "state")
    assert pulled.returncode == 3, pulled.stdout + pulled.stderr
    err = " ".join(pulled.stderr.split())
    assert "worker:0: big.bin changed while being pulled; pull again" in err, err
    assert not list(home.rglob("big.bin")) and not list(home.rglob("*.part"))


def test_a_pull_from_a_host_whose_key_is_unknown_is_refused(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path, runs: list[str]
) -> None:
    """Every path that carries bytes rides the same verified connection: a pull with a
    known_hosts that lacks the host's key reaches nothing and copies nothing."""
    inventory, run_id, _ = _detached(lab_inventory, tmp_path, MB, "keep", runs)
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    strict = Path(str(inventory).replace(".toml", "-strict.toml"))
    text = inventory.read_text()
    assert "known_hosts = " in text
    lines = [
        f'known_hosts = "{known}"' if line.startswith("known_hosts = ") else line
        for line in text.splitlines()
    ]
    strict.write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"
    refused = tfdeploy(
        "pull", run_id, "-i", str(strict), "big.bin", "--to", str(home), state=tmp_path / "st2"
    )
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "is not in" in refused.stderr and str(known) in " ".join(refused.stderr.split())
    assert not home.exists() or not list(home.rglob("*.bin*"))
