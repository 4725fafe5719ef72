"""The push's fan-out on the lab: the controller sends the code once, hosts copy it to each other
(deployer/push/fanout.py, remote/peers.py). Integrity, the run's secret, a tampering peer, a blocked
pair and a relay killed mid-push, on real hosts; the timing is bench/fanout.py's business.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
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

from deployer.core.text import human_size
from deployer.hosts.agent import Agent
from tests.lab import Lab, LabHost
from tests.support.lab_cli import tfdeploy
from tests.support.on_lab import blocked, lab_agent
from tests.support.sizes import sizes_sent

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
        r"fan-out: \S+ \S+ sent to (h\d), relayed host to host to 5 hosts", done.stdout
    )
    assert fanned, done.stdout
    uplink = sizes_sent(re.search(r"pushed .* sent from here", done.stdout).group(0))[0]
    assert 0.95 * tree <= uplink <= 1.2 * tree  # the tree once (2 digits shown), whatever N is
    assert set(digests(done.stdout).values()) == {local_digest(code)}
    assert len(digests(done.stdout)) == 6
    assert_clean(lab, hosts)
    # A second up finds everything in every store: nothing travels, no fan-out is needed.
    again = tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    assert "fan-out" not in again.stdout and "0 bytes sent" in again.stdout


def test_a_new_host_among_hosts_that_have_the_code_gets_it_once_from_here(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    """One host with an empty store among hosts that have everything: a chain of one host is
    no chain, so the star push sends it the tree, once."""
    path = inventory(lab, tmp_path, code, lab.hosts[:2])
    tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    path = inventory(lab, tmp_path, code, lab.hosts[:3])
    before = lab.uplink_bytes()
    done = tfdeploy("up", str(path), state=tmp_path / "state", check_rc=0)
    sent = lab.uplink_bytes() - before
    tree = sum(f.stat().st_size for f in code.iterdir())
    assert "fan-out" not in done.stdout, done.stdout
    said = f"{human_size(tree)} sent ({len(list(code.iterdir()))} files)"
    assert said in done.stdout, done.stdout
    assert tree <= sent <= 1.3 * tree  # once, to the new host, plus the protocol's own bytes
    assert set(digests(done.stdout).values()) == {local_digest(code)}
    assert len(digests(done.stdout)) == 3
    assert_clean(lab, lab.hosts[:3])


def test_a_host_its_peers_cannot_reach_gets_the_code_from_the_controller(
    lab: Lab, tmp_path: Path, code: Path
) -> None:
    hosts = lab.hosts[:3]
    path = inventory(lab, tmp_path, code, hosts)
    # The chain runs in inventory order: h3 is its last host.
    with (  # h3 drops what h1 and h2 send to its TF port: the chain cannot reach it
        blocked(lab, hosts[2], hosts[0], 2222, "drop"),
        blocked(lab, hosts[2], hosts[1], 2222, "drop"),
    ):
        # a security group between hosts: the network check would stop `up`; skipped, so the
        # push's own fallback is what is seen
        done = tfdeploy("up", str(path), "--no-netcheck", state=tmp_path / "state", check_rc=0)
    assert re.search(
        r"h3: could not get the code along the chain \(.*timed out.*\); it gets the code from "
        r"here",
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
        """Kills -9 whichever host's relay listener appears first, mid-transfer."""
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
    assert killed, "no relay listener was seen"
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


class Sender:
    """The fan-out's sending end, driven by hand: proof (right or wrong), header, bytes."""

    def __init__(self, address: str, port: int) -> None:
        self.sock = socket.create_connection((address, port), timeout=10)
        self.reader = self.sock.makefile("rb")
        greeting = self.reader.readline().split()
        assert greeting[0] == b"TFDP2", greeting
        self.nonce = bytes.fromhex(greeting[1].decode())

    def send(self, secret: str, blobs: list[list[object]], data: bytes) -> bytes:
        proof = hmac.new(bytes.fromhex(secret), b"tfdeploy-relay:" + self.nonce, "sha256")
        header = json.dumps({"blobs": blobs}).encode()
        with contextlib.suppress(OSError):  # a listener that hung up on a stranger
            self.sock.sendall(proof.hexdigest().encode() + b" " + header + b"\n" + data)
        try:
            return self.reader.readline()
        except OSError:  # reset: the same as closed, for a stranger
            return b""

    def close(self) -> None:
        self.sock.close()


def test_relays_need_the_secret_and_a_tampered_content_never_enters_a_store(
    lab: Lab, agents: tuple[Agent, Agent]
) -> None:
    """A relay listener reads nothing from a sender without the run's secret; a stream whose
    bytes do not hash to the named content is refused by every host along the chain."""
    a, b = agents
    host_a, host_b = lab.hosts[6], lab.hosts[7]
    data = os.urandom(1 << 20)
    digest = hashlib.sha256(data).hexdigest()
    secret = secrets.token_hex(32)
    b.relay("peertest", host_b.address, 2298, secret, None, 60)
    a.relay("peertest", host_a.address, 2299, secret, (host_b.address, 2298), 60)
    try:
        assert 2299 in lab.listening_ports(host_a)
        stranger = Sender(host_a.address, 2299)
        assert stranger.send("0" * 64, [[digest, len(data)]], data) == b""  # just closed
        stranger.close()
        tampered = bytearray(data)
        tampered[12345] ^= 0xFF
        sender = Sender(host_a.address, 2299)
        reply = json.loads(sender.send(secret, [[digest, len(data)]], bytes(tampered)))
        sender.close()
        chain = reply["chain"]
        assert len(chain) == 2 and all("arrived damaged" in e["error"] for e in chain), chain
        assert a.missing([digest]) == [digest] and b.missing([digest]) == [digest]
    finally:
        a.stop_serving("peertest")
        b.stop_serving("peertest")
    assert 2299 not in lab.listening_ports(host_a)
    assert 2298 not in lab.listening_ports(host_b)


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
        assert serving, "no relay listener was seen"
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
