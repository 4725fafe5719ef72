"""`tfdeploy:server` (remote/tfserver.py) on 127.0.0.1, started as the deployer starts a task.

The digits examples' runs on one machine repeated the lab's real ones and are gone (issue 61):
MWMS, PSS and their banners and accuracies are tests/integration/test_seed_programs.py's, the TF1
program's flags test_lifecycle's TF1 test. What is left needs no TensorFlow: the server's own
part, TensorFlow replaced by FAKE_TF, and its refusals of a bad TF_CONFIG."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TFSERVER = REPO / "remote" / "tfserver.py"
# A server's wait for a missing peer has no end: every wait is bounded.
JOB_TIMEOUT = 90.0


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

    def start(
        self,
        task: str,
        argv: list[str],
        *,
        config: str | None,
        extra: dict[str, str] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env |= {"TFDEPLOY_RUN_ID": "test-run", "TFDEPLOY_TASK": task, **(extra or {})}
        if config is not None:
            env["TF_CONFIG"] = config
        log = (self.logdir / f"{task.replace(':', '-')}.log").open("wb")
        with log:
            self.procs[task] = subprocess.Popen(
                [sys.executable, *argv],
                cwd=self.logdir,
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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop()


# A stand-in for the one part of TensorFlow that remote/tfserver.py uses: its Server binds its
# slot's port and records what it was asked; `join` waits until the process is stopped.
FAKE_TF = r"""
import json, os, socket, threading, types


class Server:
    def __init__(self, cluster, job_name, task_index, protocol, start):
        host, port = cluster[job_name][task_index].rsplit(":", 1)
        self.sock = socket.socket()
        self.sock.bind((host, int(port)))
        self.sock.listen()
        print("Server", job_name, task_index, protocol, "started" if start else "", flush=True)

    def join(self):
        threading.Event().wait()


class TFConfigClusterResolver:
    def cluster_spec(self):
        return json.loads(os.environ["TF_CONFIG"])["cluster"]


cluster_resolver = types.SimpleNamespace(TFConfigClusterResolver=TFConfigClusterResolver)
distribute = types.SimpleNamespace(Server=Server, cluster_resolver=cluster_resolver)
"""


@pytest.mark.names_tf(reason="remote/tfserver.py runs on FAKE_TF, not on TensorFlow")
def test_tfserver_serves_its_slot_of_the_cluster_until_stopped(
    cluster: Cluster, tmp_path: Path
) -> None:
    """tfdeploy's own part of `tfdeploy:server`, TensorFlow replaced by FAKE_TF (issue 61; the
    real server runs in tests/integration/test_seed_programs.py's PSS test): it asks for its
    TF_CONFIG slot's server, says where it serves, serves until stopped, and the stop ends it."""
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    chief, w0, w1, ps = (f"127.0.0.1:{port}" for port in free_ports(4))
    spec = {"chief": [chief], "worker": [w0, w1], "ps": [ps]}
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    cluster.start(
        "worker:1", [str(TFSERVER)], config=tf_config(spec, "worker", 1), extra={"PYTHONPATH": path}
    )
    port = w1.rsplit(":", 1)[1]
    cluster.wait_for_line("worker:1", f"tfdeploy:server worker:1 serving on port {port}")
    assert cluster.output("worker:1").splitlines()[0] == "Server worker 1 grpc started"
    socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    assert cluster.procs["worker:1"].poll() is None, "the server must serve until it is stopped"
    cluster.stop()
    assert not group_alive(cluster.procs["worker:1"].pid), "the server survived the stop"


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
