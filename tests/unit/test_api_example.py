"""examples/api_local.py, the Python API's example, runs start to teardown on this machine: a
real two-worker TensorFlow job through `transport = "local"`, and nothing of it left after."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "api_local.py"
LISTEN = "0A"  # /proc/net/tcp's state of a listening socket


def two_free_ports() -> int:
    """A port p with p and p + 1 free on loopback now (the two workers' TF ports)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    pytest.fail("no two consecutive free ports on loopback")


def listening(ports: set[int]) -> set[int]:
    """Which of `ports` some socket of this machine listens on."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        lines = Path(table).read_text().splitlines()[1:] if Path(table).exists() else []
        for line in lines:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == LISTEN and port in ports:
                found.add(port)
    return found


def processes_of(run_id: str, folder: Path) -> list[str]:
    """This user's processes that belong to the run: started with its id in their environment,
    or working in, or naming, the test's folder (the agent, the supervisors)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:  # gone, or another user's
            continue
        if f"TFDEPLOY_RUN_ID={run_id}".encode() in environ.split(b"\0") or (
            str(folder) in cwd or str(folder) in cmdline
        ):
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.slow
@pytest.mark.starts_tf(
    reason="examples/api_local.py runs examples/digits/mwms.py on two local workers"
)
@pytest.mark.timeout(600)
def test_the_api_example_trains_pulls_and_leaves_nothing_behind(tmp_path: Path) -> None:
    port = two_free_ports()
    env = os.environ | {
        "TFDEPLOY_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = ["--epochs", "1", "--port", str(port), "--workdir", str(tmp_path / "wd")]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *argv, "--to", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    run_id = lines[0].removeprefix("started ")
    assert run_id.startswith("digits-api-"), done.stdout
    assert lines[-1] == (
        f"run {run_id} succeeded: worker:0@local exit code 0, worker:1@local exit code 0"
    )
    assert "down: clean" in lines, done.stdout  # the job ended by itself: nothing to stop
    assert any(line.strip().startswith("worker:0@local | test_accuracy=") for line in lines)
    assert list((tmp_path / "runs" / run_id / "worker-0" / "ckpt").iterdir())
    assert processes_of(run_id, tmp_path) == []
    assert listening({port, port + 1}) == set()
