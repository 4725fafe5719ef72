"""SIGTERM and SIGHUP to `up` (timeout, CI cancellation, a closed terminal) act like Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.needs_tf(reason="preflight wants TensorFlow on the host; this job does not use it")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_up_stops_every_task_and_exits_128_plus_it(tmp_path: Path, signum: int) -> None:
    (tmp_path / "code").mkdir()
    marker = f"tfdeploy-signal-test-{os.getpid()}-{int(signum)}"
    (tmp_path / "inv.toml").write_text(
        f'[job]\nname = "sig"\ncode = "code"\ncommand = "sh -c \\"sleep 300\\" {marker}"\n'
        f'workdir = "{tmp_path}/wd"\npython = "{sys.executable}"\n'
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        'tasks = [{ role = "worker" }]\n'
    )
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")}
    up = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(tmp_path / "inv.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert up.stdout is not None
    seen = []
    for line in up.stdout:
        seen.append(line)
        if "running" in line and "worker:0@local pid" in line:
            break
    else:
        pytest.fail("up never reported the task running:\n" + "".join(seen))
    up.send_signal(signum)
    rest = up.stdout.read()
    assert up.wait(timeout=60) == 128 + signum, rest
    name = signal.Signals(signum).name
    assert f"interrupted by {name}: stopping every task" in rest
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout == "", f"tasks left running: {left.stdout}"


@pytest.mark.slow
@pytest.mark.needs_tf(reason="preflight wants TensorFlow on the host; this job does not use it")
def test_a_process_that_left_its_task_group_is_stopped_and_reported(tmp_path: Path) -> None:
    """A sidecar started with setsid (TensorBoard, a data loader) must not outlive the run."""
    (tmp_path / "code").mkdir()
    marker = f"tfdeploy-escape-test-{os.getpid()}"
    sidecar = f"setsid {sys.executable} -c 'import time; time.sleep(600)' {marker} &"
    (tmp_path / "code" / "job.sh").write_text(f"{sidecar}\nsleep 1\necho trained\n")
    (tmp_path / "inv.toml").write_text(
        f'[job]\nname = "esc"\ncode = "code"\ncommand = "sh job.sh"\n'
        f'workdir = "{tmp_path}/wd"\npython = "{sys.executable}"\n'
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        'tasks = [{ role = "worker" }]\n'
    )
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "deployer", "up", str(tmp_path / "inv.toml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "also stopped 1 process of the run that had left its task's process group" in (
        done.stdout
    ), done.stdout
    assert marker in done.stdout
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout == "", f"the sidecar outlived the run: {left.stdout}"
