"""The push's fan-out on the lab: the controller sends the code once, hosts copy it to each other
(deployer/push/fanout.py, remote/peers.py). Integrity, the run's secret, a tampering peer, a blocked
pair and a relay killed mid-push, on real hosts; the timing is bench/fanout.py's business.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.hosts.agent import Agent
from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy
from tests.support.on_lab import blocked, lab_agent

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # peers talk over the hosts' own addresses

# Every task prints one digest of the code directory it runs in: same tree, same digest.
TREE = """\
import hashlib, os
digest = hashlib.sha256()
for top, dirs, files in sorted(os.walk(".")):
    for name in sorted(files):
        path = os.path.join(top, name)
        digest.update(path.encode() + b"\\0" + open(path, "rb").read())
print("tree", digest.hexdigest())
"""


def local_digest(code: Path) -> str:
    digest = hashlib.sha256()
    for top, _dirs, files in sorted(os.walk(code)):
        for name in sorted(files):
            path = Path(top) / name
            rel = "./" + path.relative_to(code).as_posix()
            digest.update(rel.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """3 MB that does not compress, and the digest printer."""
    code = tmp_path / "code"
    code.mkdir()
    for i in range(3):
        (code / f"weights{i}.bin").write_bytes(os.urandom(1 << 20))
    (code / "tree.py").write_text(TREE)
    return code


def inventory(lab: Lab, tmp_path: Path, code: Path, hosts: list[LabHost]) -> Path:
    return lab.write_inventory(
        tmp_path / "fanout.toml",
        tasks=[[{"role": "worker"}]] * len(hosts),
        hosts=hosts,
        job={
            "code": str(code),
            "command": f"{lab.python} tree.py",
            "require_tensorflow": False,
            "workdir": f"~/.tfdeploy-{tmp_path.name}",  # an empty store for this test
        },
    )


def digests(out: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+) +\| tree ([0-9a-f]{64})$", out, re.M))


def assert_clean(lab: Lab, hosts: list[LabHost]) -> None:
    for h in hosts:
        assert not lab.leftovers(h), lab.leftovers(h)  # no server left, no port listening


def test_the_code_goes_out_once_and_every_host_has_the_same_tree(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    hosts = lab.hosts[:6]
    path = inventory(lab, tmp_path, code, hosts)
    done = tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    tree = sum(f.stat().st_size for f in code.iterdir())
    fanned = re.search(
        r"fan-out: (\d+) bytes sent to (h\d), copied host to host to 5 hosts in 3 rounds",
        done.stdout,
    )
    assert fanned, done.stdout
    uplink = int(re.search(r"(\d+) bytes sent from here", done.stdout).group(1))
    assert tree <= uplink <= 1.2 * tree  # the tree once, whatever the number of hosts
    assert set(digests(done.stdout).values()) == {local_digest(code)}
    assert len(digests(done.stdout)) == 6
    assert_clean(lab, hosts)
    # A second up finds everything in every store: nothing travels, no fan-out is needed.
    again = tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    assert "fan-out" not in again.stdout and "0 bytes sent" in again.stdout


def test_a_host_that_cannot_reach_its_peers_gets_the_code_from_the_controller(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    hosts = lab.hosts[:3]
    path = inventory(lab, tmp_path, code, hosts)
    with (
        blocked(lab, hosts[0], hosts[2], 2222, "drop"),
        blocked(lab, hosts[1], hosts[2], 2222, "drop"),
    ):
        # a security group between hosts: the network check would stop `up`; skipped, so the
        # push's own fallback is what is seen
        done = tfdeploy("up", str(path), "--no-netcheck", state=tmp_path / "state", check_rc=0)
    assert re.search(
        r"h3: could not copy from its peers \(.*timed out.*\); it gets the code from here",
        done.stdout,
    ), done.stdout
    assert set(digests(done.stdout).values()) == {local_digest(code)}
    assert_clean(lab, hosts)


def test_a_relay_killed_mid_push_does_not_fail_the_deploy(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    hosts = lab.hosts[:3]
    path = inventory(lab, tmp_path, code, hosts)
    workdir = f"~/.tfdeploy-{tmp_path.name}"
    killed: list[str] = []

    def kill_the_first_server() -> None:
        """Kills -9 whichever host's store server appears first, mid-transfer."""
        for _ in range(600):
            for h in hosts:
                found = lab.run(h, f"cat {workdir}/hosts/*/peers/*.json 2>/dev/null")
                pid = re.search(r'"pid": (\d+)', found.stdout or "")
                if pid:
                    lab.run(h, f"kill -9 {pid.group(1)}")
                    killed.append(h.name)
                    return
            threading.Event().wait(0.02)

    for h in hosts[1:]:
        lab.cap_bandwidth(h, "8mbit")  # 3 MB takes ~3 s to copy: time to kill the relay
    killer = threading.Thread(target=kill_the_first_server, daemon=True)
    killer.start()
    try:
        done = tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    finally:
        for h in hosts[1:]:
            lab.uncap_bandwidth(h)
    killer.join(5)
    assert killed, "no store server was seen"
    assert "it gets the code from here" in done.stdout, done.stdout
    assert set(digests(done.stdout).values()) == {local_digest(code)}
    assert len(digests(done.stdout)) == 3
    assert_clean(lab, hosts)


# ---- the peer protocol itself, driven through the agents -------------------------------------


@pytest.fixture
def agents(lab: Lab) -> Iterator[tuple[Agent, Agent]]:
    a, b = lab_agent(lab, lab.hosts[6]), lab_agent(lab, lab.hosts[7])
    yield a, b
    for agent in (a, b):
        agent.transport.close()
    for host in lab.hosts[6:8]:  # the test's run directory; the store keeps its content
        lab.run(host, "rm -rf ~/.tfdeploy/hosts/*/runs/peertest")


def stored(agent: Agent, data: bytes) -> str:
    """Puts `data` into the agent's store (as a push would); returns its sha256."""
    digest = hashlib.sha256(data).hexdigest()
    run = {"run_id": "peertest", "job": "peertest", "detached": True, "controller": "test"}
    agent.call("materialize", files=[], blobs=[[digest, len(data)]], body=[data], **run)
    return digest


class Rogue:
    """A peer of the run (it knows the secret) that sends the wrong bytes for every content."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.sendall(b"TFDP1 " + os.urandom(16).hex().encode() + b"\n")
            line = conn.makefile("rb").readline()
            want = __import__("json").loads(line.partition(b" ")[2])["want"]
            for digest in want:
                conn.sendall(f'{{"sha": "{digest}", "size": 1048576, "mode": 420}}\n'.encode())
                conn.sendall(os.urandom(1 << 20))


def test_peers_need_the_secret_and_a_tampered_content_never_enters_the_store(
    lab: Lab, agents: tuple[Agent, Agent]
) -> None:
    a, b = agents
    host_a = lab.hosts[6]
    data = os.urandom(1 << 20)
    digest = stored(a, data)
    secret = secrets.token_hex(32)
    a.serve_store("peertest", host_a.address, 2299, secret, 60)
    try:
        assert 2299 in lab.listening_ports(host_a)
        # Without the secret: the server says hello, then nothing; the connection just ends.
        with socket.create_connection((host_a.address, 2299), timeout=5) as s:
            reader = s.makefile("rb")
            assert reader.readline().startswith(b"TFDP1 ")
            s.sendall(b"0" * 64 + b' {"want": ["' + digest.encode() + b'"]}\n')
            assert reader.read() == b""
        # A peer sending damaged bytes is refused; the good peer's copy is the one stored.
        bridge = lab.hosts[0].address.rsplit(".", 1)[0] + ".1"
        rogue = Rogue(bridge)
        got = b.fetch_from_peers(
            "peertest",
            [(digest, len(data))],
            [(bridge, rogue.port), (host_a.address, 2299)],
            secret,
            60,
        )
        assert got.fetched == 1 and got.missing == ()
        assert any("arrived damaged (sha256 mismatch)" in e for e in got.errors), got.errors
        assert b.missing([digest]) == []
        copy = lab.run(lab.hosts[7], f"sha256sum ~/.tfdeploy/store/{digest}")
        assert copy.stdout.split()[0] == digest
    finally:
        a.stop_serving("peertest")
    assert 2299 not in lab.listening_ports(host_a)


def test_ctrl_c_during_a_fan_out_leaves_no_server_and_no_partial_file(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    hosts = lab.hosts[:4]
    path = inventory(lab, tmp_path, code, hosts)
    workdir = f"~/.tfdeploy-{tmp_path.name}"
    for h in hosts:
        lab.cap_bandwidth(h, "8mbit")  # the copies take seconds: time to press Ctrl-C
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")}
    up = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        serving = False
        for _ in range(1500):
            serving = any(
                lab.run(h, f"ls {workdir}/hosts/*/peers/*.json 2>/dev/null").stdout.strip()
                for h in hosts
            )
            if serving or up.poll() is not None:
                break
        assert serving, "no store server was seen"
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
        for h in hosts:
            lab.uncap_bandwidth(h)
    assert up.returncode == 130, out
    assert_clean(lab, hosts)
    for h in hosts:
        partial = lab.run(h, f"find {workdir} -name '*.part'")
        assert partial.stdout.strip() == "", f"{h.name}: {partial.stdout}"
