"""Bulk bytes keep memory bounded (issue #25): one 1 GB file pushed and pulled back through the
real CLI and agent (local transport), with every process of it far below 300 MB.

The file is sparse (reads as zeros, costs no disk until the host's store writes it), so the test
measures the data path's memory, not the disk. Before the data plane was rebuilt, a file larger
than a push batch was one request held whole in memory (1 GB of RSS and more for this one).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SIZE = 1 << 30
LIMIT_MB = 300  # the bound for the controller's RSS, whatever the file size


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_mb(argv: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """Runs argv under a small Python parent and returns (exit code, the peak RSS of any process
    it waited for, the local agent processes below it included, in MB, output)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stdout.write(r.stdout + r.stderr)\n"
        "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    peak = int(done.stdout.rsplit("PEAK", 1)[1].split()[0]) / 1024
    return done.returncode, peak, done.stdout


@pytest.mark.slow
def test_a_1_gb_file_pushes_and_pulls_with_bounded_memory(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    big = code / "big.bin"
    with big.open("wb") as f:
        f.truncate(SIZE)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "bulk"\ncode = "code"\ncommand = "sleep 600"\n'
        f'workdir = "{tmp_path}/wd"\npython = "{sys.executable}"\nport = {_port()}\n'
        "require_tensorflow = false\nfanout = false\nstop_grace = 1\n"
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        'tasks = [{ role = "worker" }]\n'
    )
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")}
    cli = [sys.executable, "-m", "deployer"]
    try:
        code_up, peak_up, out = _peak_mb([*cli, "up", "--detach", str(inventory)], env)
        assert code_up == 0, out
        run_id = re.search(r"run (\S+) is running detached", out)[1]
        stored = list((tmp_path / "wd").glob("store/[0-9a-f]*"))
        assert [p.stat().st_size for p in stored] == [SIZE]  # arrived whole, hash checked
        home = tmp_path / "home"
        code_pull, peak_pull, out = _peak_mb(
            [*cli, "pull", run_id, "big.bin", "--to", str(home)], env
        )
        assert code_pull == 0, out
        pulled = home / run_id / "worker-0" / "big.bin"
        assert pulled.stat().st_size == SIZE
        with pulled.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        zeros, block = hashlib.sha256(), bytes(1 << 20)
        for _ in range(SIZE // len(block)):
            zeros.update(block)
        assert digest == zeros.hexdigest()
    finally:
        subprocess.run([*cli, "down", str(inventory)], env=env, capture_output=True, timeout=60)
    assert peak_up < LIMIT_MB, f"up --detach peaked at {peak_up:.0f} MB"
    assert peak_pull < LIMIT_MB, f"pull peaked at {peak_pull:.0f} MB"
    print(json.dumps({"up_peak_mb": round(peak_up), "pull_peak_mb": round(peak_pull)}))
