"""Results come home, on the lab: pull and artifacts (byte-identical, 0 bytes the second time,
`..` and symlinks out refused, after a failure and after Ctrl-C, through a bastion), and a
tunnel to a task host's loopback, with a real TensorBoard where the package is installed."""

from __future__ import annotations

import hashlib
import importlib.util
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import Up, _env
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

# Each task writes its own file and one every replica shares, prints their hashes, and plants
# a symlink out of its directory that no pull may follow.
WRITE = """\
import hashlib, os, sys, time
me = os.environ["TFDEPLOY_TASK"].replace(":", "-")
os.makedirs("out/ckpt", exist_ok=True)
mine = os.urandom(3_000_000)
shared = b"replica" * 400_000
open(f"out/ckpt/{me}.bin", "wb").write(mine)
open("out/ckpt/shared.bin", "wb").write(shared)
os.symlink("/etc/passwd", f"out/passwd-{me}")
print("sha", me, hashlib.sha256(mine).hexdigest(), flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""

SERVE = """\
import http.server, functools, os, sys
os.makedirs("site", exist_ok=True)
open("site/index.html", "w").write("from " + os.environ["TFDEPLOY_TASK"] + "\\n")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="site")
print("serving", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
"""


# Answers each connection only once the client has finished sending (half-closed): how many
# bytes it got. A proxy that drops the connection on the client's EOF loses every answer.
# Clients saying "client N" are answered only once 400 of them are connected: all at once.
AFTER_EOF = """\
import socket, sys, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(1024)
together = threading.Barrier(400, timeout=90)
print("listening", flush=True)
def answer(conn):
    got = b""
    while True:
        data = conn.recv(65536)
        if not data:
            break
        got += data
    if got.startswith(b"client "):
        together.wait()
    conn.sendall(b"got %d bytes: %s" % (len(got), got[:20]))
    conn.close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "write.py").write_text(WRITE)
    (code / "serve.py").write_text(SERVE)
    (code / "after_eof.py").write_text(AFTER_EOF)
    return code


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def results(lab_inventory: Any, code: Path, to: Path, sleep: float, code_: int, **job: Any) -> Path:
    return lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={
            "name": "results",
            "command": f"python3 write.py {sleep} {code_}",
            "artifacts": ["out/**"],
            "artifacts_to": str(to),
            "stop_grace": 1,
            **job,
        },
    )


def check_home(base: Path, shas: dict[str, str]) -> None:
    for me, digest in shas.items():
        assert sha(base / me / "out" / "ckpt" / f"{me}.bin") == digest
        assert (base / me / "out" / "ckpt" / "shared.bin").read_bytes() == b"replica" * 400_000
        assert not (base / me / "out" / f"passwd-{me}").exists()  # a symlink out of the run


def test_artifacts_and_pull_bring_files_home_once(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    to = tmp_path / "home"
    inventory = results(lab_inventory, code, to, 0, 0)
    up = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    shas = {
        line.split()[-2]: line.split()[-1] for line in up.stdout.splitlines() if "| sha " in line
    }
    assert set(shas) == {"worker-0", "worker-1"}
    assert "artifacts: pulled 4 files into" in up.stdout
    assert "a symlink out of" in up.stdout  # reported, not followed
    check_home(to / run_id, shas)
    again = tfdeploy(
        "pull", run_id, "out/**", "--to", str(to), state=tmp_path / "state", check_rc=0
    )
    assert "0 bytes sent, every file was already here" in again.stdout
    escape = tfdeploy("pull", run_id, "../run.json", "--to", str(to), state=tmp_path / "state")
    assert escape.returncode == 5 and "'..' may not climb out" in escape.stdout
    # it said "every file was already here" (issue #28, item 13)
    assert "no file matched ../run.json on worker:0@h1, worker:1@h2; nothing was pulled" in (
        escape.stderr
    )
    assert not list(to.rglob("run.json"))


def test_artifacts_come_home_after_a_failure_and_after_ctrl_c(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    failed_to = tmp_path / "failed"
    # Both fail after 2 s: a task that failed at once could have its peer stopped before that
    # peer wrote anything (a loaded machine starts Python slowly), and then 2 files come home.
    failed = results(lab_inventory, code, failed_to, 2, 3, name="fails")
    up = tfdeploy("up", str(failed), state=tmp_path / "state", check_rc=1)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    assert "artifacts: pulled 4 files" in up.stdout
    assert len(list((failed_to / run_id).rglob("*.bin"))) == 4

    stopped_to = tmp_path / "stopped"
    inventory = results(lab_inventory, code, stopped_to, 300, 0, name="ctrlc")
    running = Up(inventory, state=tmp_path / "state")
    running.wait_for(r"worker:1@\S+ \| sha ")
    running.wait_for(r"worker:0@\S+ \| sha ")
    running.proc.send_signal(signal.SIGINT)
    assert running.finish(timeout=60) == 130, running.report()
    assert "artifacts: pulled 4 files" in running.stdout
    assert len(list((stopped_to / running.run_id()).rglob("*.bin"))) == 4


def test_pull_and_tunnel_through_a_bastion(bastion_lab: Lab, code: Path, tmp_path: Path) -> None:
    lab = bastion_lab
    inventory = lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}]],
        job={
            "code": str(code),
            "name": "behind",
            "command": "python3 write.py 0 0",
            "role_commands": {},
        },
    )
    up = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    pulled = tfdeploy(
        "pull", run_id, "out/ckpt/*", "--to", str(tmp_path / "home"), state=tmp_path / "state"
    )
    assert pulled.returncode == 0 and "pulled 2 files" in pulled.stdout, pulled.stderr
    [digest] = [line.split()[-1] for line in up.stdout.splitlines() if "| sha " in line]
    assert sha(tmp_path / "home" / run_id / "worker-0" / "out" / "ckpt" / "worker-0.bin") == digest

    serving = lab.write_inventory(
        tmp_path / "serve.toml",
        tasks=[[{"role": "worker"}]],
        job={"code": str(code), "name": "web", "command": "python3 serve.py 8765"},
    )
    up = tfdeploy("up", "--detach", str(serving), state=tmp_path / "state", check_rc=0)
    web_run = up.stdout.split("(run ")[1].split(")")[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "tunnel", web_run, "8765"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path / "state"),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[1]
        assert url.startswith("http://127.0.0.1:"), line
        body = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "from worker:0" not in body:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert body == "from worker:0\n"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        tfdeploy("down", web_run, state=tmp_path / "state", check_rc=0)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed here"
)
# The forward takes the sidecar's own port here when free: a host on this machine's loopback
# would then find its 127.0.0.1:16006 taken by the controller's end.
@pytest.mark.isolated(reason="the host's 127.0.0.1 must not be the controller's")
def test_a_tensorboard_sidecar_is_forwarded_while_up_watches(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={
            "name": "board",
            "command": "python3 write.py 60 0",
            "tensorboard": {"logdir": "out", "port": 16006},
            "stop_grace": 1,
        },
    )
    running = Up(inventory, state=tmp_path / "state")
    running.wait_for(r"tensorboard: http://127\.0\.0\.1:\d+/ \(forwarded to tensorboard:0@h1")
    url = next(
        line.split("tensorboard: ")[1].split()[0]
        for _, line in running.lines
        if "tensorboard: http" in line
    )
    body = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "tb-relative-root" not in body:
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            time.sleep(1)
    assert "tb-relative-root" in body  # TensorBoard's own page, from the host's loopback
    # ... and only there: another host cannot reach it on the network
    h1, h2 = lab.hosts[0], lab.hosts[1]
    probe = f"import socket; socket.create_connection(('{h1.address}', 16006), timeout=3)"
    assert lab.run(h2, ["python3", "-c", probe]).returncode != 0
    running.proc.send_signal(signal.SIGINT)
    assert running.finish(timeout=60) == 130


class Tunnel:
    """`tfdeploy tunnel ...` in the background, its output read line by line."""

    def __init__(self, state: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deployer", "tunnel", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(state),
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first.startswith("tfdeploy: http://127.0.0.1:"), first + self.rest()
        self.port = int(first.split()[1].rsplit(":", 1)[1].rstrip("/"))

    def rest(self) -> str:
        out, err = self.proc.communicate(timeout=30)
        return out + err


def ask(port: int, message: bytes) -> bytes:
    """Sends, half-closes (no more to send), and reads the answer to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(message)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def test_a_tunnel_half_closes_serves_400_connections_and_ends_with_its_run(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """Issue 28 item 10: a client that half-closed after sending got 0 bytes back; 400
    simultaneous connections lost 62 (select() with descriptors above 1024); the tunnel ran on
    after its run was stopped, and opened on a finished run without a word."""
    state = tmp_path / "state"
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "eof", "command": "python3 after_eof.py 8766", "stop_grace": 1},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    tunnel = Tunnel(state, run_id, "8766")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the task listens
            if ask(tunnel.port, b"ping").startswith(b"got 4 bytes"):
                break
            time.sleep(0.5)
        assert ask(tunnel.port, b"x" * 300_000) == b"got 300000 bytes: " + b"x" * 20

        answers: dict[int, bytes] = {}
        barrier = threading.Barrier(400)

        def client(i: int) -> None:
            barrier.wait()
            try:
                answers[i] = ask(tunnel.port, b"client %d" % i)
            except OSError as exc:
                answers[i] = repr(exc).encode()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(400)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        wrong = {
            i: a
            for i, a in answers.items()
            if a != b"got %d bytes: client %d" % (len(b"client %d" % i), i)
        }
        assert len(answers) == 400 and not wrong, f"{len(wrong)} wrong: {list(wrong.items())[:3]}"
    finally:
        tfdeploy("down", run_id, state=state, check_rc=0)
    try:
        code_ = tunnel.proc.wait(timeout=20)  # the run is stopped: the tunnel ends by itself
    except subprocess.TimeoutExpired:
        tunnel.proc.send_signal(signal.SIGINT)
        raise AssertionError("the tunnel outlived its run:\n" + tunnel.rest()) from None
    said = " ".join(tunnel.rest().split())
    assert code_ == 0 and f"worker:0 of run {run_id} has ended" in said, said
    assert "the tunnel is closed" in said

    again = subprocess.run(
        [sys.executable, "-m", "deployer", "tunnel", run_id, "8766"],
        capture_output=True,
        text=True,
        env=_env(state),
        timeout=60,
    )
    said = " ".join(again.stderr.split())
    assert again.returncode == 2 and again.stdout == "", again
    assert f"error: worker:0 of run {run_id} has ended (stopped by tfdeploy)" in said, said


def test_down_pulls_the_artifacts_of_a_detached_run_and_status_says_they_wait(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """`up --detach` pulls nothing when the run ends: the tasks write their checkpoints and
    exit, `status` says the artifacts wait, `down` brings them into artifacts_to."""
    to, state = tmp_path / "home", tmp_path / "state"
    inventory = results(lab_inventory, code, to, 0, 0)
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    run_id = up.stdout.split("(run ")[1].split(")")[0]
    waiting = f"run {run_id} has ended; its job.artifacts are not pulled yet"
    deadline = time.monotonic() + 60
    while waiting not in (status := tfdeploy("status", str(inventory), state=state)).stderr:
        assert time.monotonic() < deadline, status.stdout + status.stderr
        time.sleep(1)
    assert not to.exists()  # nothing came home when the run ended
    down = tfdeploy("down", str(inventory), state=state, check_rc=0)
    assert f"run {run_id}: artifacts: pulled 4 files into" in down.stdout, down.stdout
    for me in ("worker-0", "worker-1"):
        assert (to / run_id / me / "out" / "ckpt" / f"{me}.bin").stat().st_size == 3_000_000
    assert waiting not in tfdeploy("status", str(inventory), state=state).stderr
    again = tfdeploy("down", run_id, state=state, check_rc=0)
    assert "artifacts" not in again.stdout  # pulled once

    # --no-artifacts: stopped, nothing pulled, and status still says they wait.
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    second = up.stdout.split("(run ")[1].split(")")[0]
    down = tfdeploy("down", "--no-artifacts", second, state=state, check_rc=0)
    assert "artifacts" not in down.stdout and not (to / second).exists()
