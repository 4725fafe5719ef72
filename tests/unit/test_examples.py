"""Real TensorFlow clusters on 127.0.0.1 running the digits examples and tfdeploy:server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits"
TFSERVER = REPO / "remote" / "tfserver.py"
# TF has no startup timeout: a missing peer hangs forever, so every wait is bounded.
JOB_TIMEOUT = 90.0
ACCURACY = re.compile(r"^test_accuracy=([0-9.]+)$", re.MULTILINE)


def free_ports(count: int) -> list[int]:
    """Ports free on loopback right now; all sockets stay open until all are chosen."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


class Cluster:
    """Starts tasks as the deployer would (own session, log file) and kills them all at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, task: str, argv: list[str], *, config: str | None, cuda: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env |= {
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "TF_ENABLE_ONEDNN_OPTS": "0",
            "CUDA_VISIBLE_DEVICES": cuda,
            "TFDEPLOY_RUN_ID": "test-run",
            "TFDEPLOY_TASK": task,
            # as under tfdeploy, but never in the example's own directory (pushed by other tests)
            "CHECKPOINT_DIR": str(self.logdir / "ckpt"),
        }
        if config is not None:
            env["TF_CONFIG"] = config
        log = (self.logdir / f"{task.replace(':', '-')}.log").open("wb")
        with log:
            self.procs[task] = subprocess.Popen(
                [sys.executable, *argv],
                cwd=DIGITS,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self, task: str) -> str:
        return (self.logdir / f"{task.replace(':', '-')}.log").read_text(errors="replace")

    def wait(self, task: str, timeout: float = JOB_TIMEOUT) -> int:
        try:
            return self.procs[task].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logs = "\n".join(f"--- {name}\n{self.output(name)[-2000:]}" for name in self.procs)
            pytest.fail(f"{task} still running after {timeout:.0f} s\n{logs}")

    def wait_for_line(self, task: str, text: str, timeout: float = JOB_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(task):
            if self.procs[task].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{task} never printed {text!r}:\n{self.output(task)[-2000:]}")
            time.sleep(0.2)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every group, SIGKILL what is left after grace (MWMS ignores SIGTERM)."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # Only while the leader is unreaped: after that its pid (= pgid) may belong to someone else.
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def banner_config(output: str) -> dict[str, object]:
    match = re.search(r"^tfdeploy-env TF_CONFIG=(\{.*\}) CUDA_VISIBLE_DEVICES=", output, re.M)
    assert match, f"no env banner in:\n{output[-2000:]}"
    return dict(json.loads(match.group(1)))


def accuracy(output: str) -> float:
    found = ACCURACY.findall(output)
    assert found, f"no test_accuracy line in:\n{output[-2000:]}"
    return float(found[-1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.starts_tf
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mwms_two_workers(cluster: Cluster) -> None:
    spec = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    configs = {f"worker:{i}": tf_config(spec, "worker", i) for i in range(2)}
    for i, (task, config) in enumerate(configs.items()):
        cluster.start(task, ["mwms.py", "--epochs", "6"], config=config, cuda=str(i))
    for i, (task, config) in enumerate(configs.items()):
        assert cluster.wait(task) == 0, cluster.output(task)
        out = cluster.output(task)
        assert banner_config(out) == json.loads(config)
        assert f"CUDA_VISIBLE_DEVICES={i} TFDEPLOY_TASK={task}" in out
        assert "epoch 6 loss" in out
        assert accuracy(out) >= 0.90


@pytest.mark.starts_tf
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pss_chief_with_tfservers(cluster: Cluster) -> None:
    chief, w0, w1, ps = (f"127.0.0.1:{port}" for port in free_ports(4))
    spec = {"chief": [chief], "worker": [w0, w1], "ps": [ps]}
    servers = {"ps:0": ("ps", 0), "worker:0": ("worker", 0), "worker:1": ("worker", 1)}
    for task, (kind, index) in servers.items():
        cluster.start(task, [str(TFSERVER)], config=tf_config(spec, kind, index))
    cluster.start("chief:0", ["pss.py"], config=tf_config(spec, "chief", 0))

    assert cluster.wait("chief:0") == 0, cluster.output("chief:0")
    out = cluster.output("chief:0")
    assert banner_config(out)["task"] == {"type": "chief", "index": 0}
    assert accuracy(out) >= 0.90
    # The servers outlive the chief (they join forever); stopping them is the deployer's job.
    for task in servers:
        port = spec[task.split(":")[0]][int(task.split(":")[1])].rsplit(":", 1)[1]
        assert f"tfdeploy:server {task} serving on port {port}" in cluster.output(task)
        assert cluster.procs[task].poll() is None, f"{task} exited early"
    cluster.stop()
    for task in servers:
        assert not group_alive(cluster.procs[task].pid), f"{task} survived the stop"


@pytest.mark.starts_tf
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tf1_style_flags(cluster: Cluster) -> None:
    ps, w0, w1 = (f"127.0.0.1:{port}" for port in free_ports(3))
    spec = {"worker": [w0, w1], "ps": [ps]}
    for kind, index in [("ps", 0), ("worker", 0), ("worker", 1)]:
        argv = [
            "tf1_style.py",
            f"--job_name={kind}",
            f"--task_index={index}",
            f"--ps_hosts={ps}",
            f"--worker_hosts={w0},{w1}",
        ]
        if (kind, index) == ("worker", 1):
            # A non-chief MonitoredTrainingSession that looks before the chief initialised the
            # variables sleeps 30 s before it looks again (SessionManager): once the chief has
            # trained an epoch, it starts at once (and may find the training done: it then only
            # evaluates the shared variables). The lab test runs both at once under tfdeploy.
            cluster.wait_for_line("worker:0", "epoch 1 loss")
        # The deployer sets TF_CONFIG anyway; the script must ignore it and use its flags.
        cluster.start(f"{kind}:{index}", argv, config=tf_config(spec, kind, index))
    for task in ("worker:0", "worker:1"):
        assert cluster.wait(task) == 0, cluster.output(task)
        assert accuracy(cluster.output(task)) >= 0.90
    assert "global_step" in cluster.output("worker:0")  # the step the trainers share on the ps
    assert cluster.procs["ps:0"].poll() is None, "ps must serve until it is stopped"


@pytest.mark.names_tf(
    reason="remote/tfserver.py refuses the TF_CONFIG before it imports TensorFlow"
)
@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "TF_CONFIG is not set"),
        ("{not json", "TF_CONFIG is not valid JSON"),
        (tf_config({"worker": ["127.0.0.1:1"]}, "evaluator", 0), "evaluator"),
        (tf_config({"worker": ["127.0.0.1:1"]}, "worker", 3), "cluster has no worker:3"),
    ],
)
def test_tfserver_rejects_bad_tf_config(cluster: Cluster, config: str | None, message: str) -> None:
    cluster.start("worker:0", [str(TFSERVER)], config=config)
    assert cluster.wait("worker:0", timeout=30) == 2
    out = cluster.output("worker:0")
    assert out.startswith("tfdeploy:server: error: ") and message in out, out
    assert len(out.strip().splitlines()) == 1, out
