"""The transport layer against real sshd hosts: exec, put, host keys, faults, jump hosts."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from deployer.core.errors import HostError
from deployer.hosts import hostkeys
from deployer.hosts.ssh import Endpoint
from deployer.hosts.ssh_transport import SSHTransport
from deployer.hosts.transport import OutputTooLarge
from tests.lab.base import wait_until
from tests.support.transport import HOSTILE, endpoint, expect_host_error, make_key


def target_for(lab: Any, host: Any, **overrides: Any) -> Endpoint:
    fields: dict[str, Any] = {
        "port": host.port,
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "connect_timeout": 5.0,
        "ssh_config": os.devnull,  # never the developer's ~/.ssh/config
    }
    fields.update(overrides)
    name, address = fields.pop("name", host.name), fields.pop("address", host.address)
    return endpoint(name, address, **fields)


@pytest.fixture
def transport(lab: Any) -> Iterator[SSHTransport]:
    t = SSHTransport(target_for(lab, lab.hosts[0]))
    yield t
    t.close()


# -- exec --------------------------------------------------------------------------------------


@pytest.mark.lab
def test_run_passes_stdin_and_returns_stdout_stderr_and_exit_code(transport: SSHTransport) -> None:
    script = "cat; echo oops >&2; exit 7"
    result = transport.run(["sh", "-c", script], stdin=b"hello\x00\xffworld")
    assert result.exit_code == 7
    assert result.stdout == b"hello\x00\xffworld"
    assert result.stderr == b"oops\n"
    assert transport.run(["true"]).exit_code == 0


@pytest.mark.lab
def test_large_outputs_on_both_streams_do_not_deadlock(transport: SSHTransport) -> None:
    # stderr first: a reader that drained only stdout would stall once stderr's window is full.
    script = "head -c 6000000 /dev/zero >&2; head -c 8000000 /dev/zero; cat"
    started = time.monotonic()
    result = transport.run(["sh", "-c", script], stdin=b"x" * 5_000_000, timeout=60)
    assert result.exit_code == 0
    assert len(result.stderr) == 6_000_000
    assert result.stdout == b"\0" * 8_000_000 + b"x" * 5_000_000
    assert time.monotonic() - started < 30


@pytest.mark.lab
def test_output_past_max_output_ends_the_command_and_the_connection_stays_usable(
    transport: SSHTransport,
) -> None:
    """A host's command that prints without end is ended at max_output (its channel closed, so
    the remote writer dies of SIGPIPE), never buffered whole; the connection goes on."""
    with pytest.raises(OutputTooLarge, match=r"printed more than 2000000 bytes"):
        transport.run(["yes", "tfdeploy-endless"], max_output=2_000_000, timeout=60)
    assert transport.run(["echo", "ok"]).stdout == b"ok\n"
    wait_until(
        "the endless writer to die with its channel",
        lambda: transport.run(["pgrep", "-f", "yes tfdeploy-endless"]).exit_code == 1,
    )


@pytest.mark.lab
def test_hostile_argv_arrives_byte_for_byte_and_runs_nothing(transport: SSHTransport) -> None:
    marker = f"/tmp/tfdeploy-marker-{os.getpid()}"
    for raw in HOSTILE:
        arg = raw.replace("MARK", marker)
        result = transport.run(["printf", "%s", arg])
        assert result.stdout == arg.encode(), (arg, result)
        assert result.exit_code == 0
    for arg in (f"$(touch {marker})", f"; touch {marker}"):  # as the program name, too
        assert transport.run([arg]).exit_code == 127
    assert transport.run(["test", "-e", marker]).exit_code == 1, "a hostile string ran"


@pytest.mark.lab
def test_run_timeout_raises_and_the_connection_stays_usable(transport: SSHTransport) -> None:
    started = time.monotonic()
    error = expect_host_error(
        lambda: transport.run(["sleep", "30.25"], timeout=1), r"sleep 30\.25 timed out after 1 s"
    )
    assert time.monotonic() - started < 3
    assert error.host == transport.name
    assert transport.run(["echo", "ok"]).stdout == b"ok\n"
    # Without a pty the host's sleep outlives its closed channel (as under OpenSSH's ssh): ended
    # here, or a later test's check of the lab finds it.
    assert transport.run(["pkill", "-x", "-f", "sleep 30.25"]).exit_code == 0


@pytest.mark.lab
def test_many_concurrent_runs_share_one_connection(transport: SSHTransport) -> None:
    transport.connect()
    first = transport._transport()
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(6):
            word = f"w{n}-{i}"
            result = transport.run(["sh", "-c", 'cat; printf " %s" "$1"', "sh", word], stdin=b"in")
            if result.stdout != f"in {word}".encode():
                failures.append(f"{word}: {result}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    assert not failures
    assert transport._transport() is first, "runs must reuse the one connection"
    print(f"16 threads x 6 runs: {elapsed:.2f} s")


# -- put ---------------------------------------------------------------------------------------


@pytest.mark.lab
def test_put_is_atomic_creates_parents_and_sets_mode(transport: SSHTransport) -> None:
    home = transport.run(["sh", "-c", "echo $HOME"]).stdout.decode().strip()
    base = f"{home}/tfdeploy-put-{os.getpid()}"
    path = f"{base}/a/b/secret.json"
    try:
        transport.put(b'{"token": 1}', path)
        stat = transport.run(["stat", "-c", "%a %i", path]).stdout.decode().split()
        assert stat[0] == "600"
        assert transport.run(["cat", path]).stdout == b'{"token": 1}'
        assert transport.run(["stat", "-c", "%a", f"{base}/a"]).stdout.strip() == b"700"

        big = os.urandom(3_000_000)
        transport.put(big, path, mode=0o755)
        after = transport.run(["stat", "-c", "%a %i", path]).stdout.decode().split()
        assert after[0] == "755"
        assert after[1] != stat[1], "a put must rename a new file into place, not rewrite it"
        assert transport.run(["cat", path]).stdout == big
        listing = transport.run(["ls", "-A", f"{base}/a/b"]).stdout.decode().split()
        assert listing == ["secret.json"], "no .part file may be left behind"

        transport.put(b"tilde", f"~/tfdeploy-put-{os.getpid()}/t")
        assert transport.run(["cat", f"{base}/t"]).stdout == b"tilde"
    finally:
        transport.run(["rm", "-rf", base])


@pytest.mark.lab
def test_put_into_an_unwritable_place_is_a_host_error(transport: SSHTransport) -> None:
    expect_host_error(lambda: transport.put(b"x", "/proc/tfdeploy/x"), r"cannot write /proc")


# -- host keys ---------------------------------------------------------------------------------


def server_key_line(lab: Any, host: Any) -> tuple[str, str]:
    """The (type, base64) the lab recorded for `host` in its known_hosts."""
    name = hostkeys.key_name(host.address, host.port)
    keys = paramiko.HostKeys(str(lab.known_hosts)).lookup(name)
    assert keys, f"lab known_hosts has no {name}"
    kind = keys.keys()[0]
    return kind, keys[kind].get_base64()


@pytest.mark.lab
def test_unknown_host_is_refused_with_the_keyscan_hint(lab: Any, tmp_path: Path) -> None:
    host = lab.hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = SSHTransport(target_for(lab, host, known_hosts=str(known)))
    error = expect_host_error(t.connect, r"host key of .* is not in .*refusing")
    assert error.hint and f"ssh-keyscan -p {host.port} {host.address} >> {known}" in error.hint
    assert "accept-new" in error.hint
    assert known.read_text() == "", "strict mode must never record a key"


@pytest.mark.lab
def test_changed_host_key_is_refused_with_the_keygen_hint(lab: Any, tmp_path: Path) -> None:
    host = lab.hosts[0]
    kind, _ = server_key_line(lab, host)
    assert kind == "ssh-ed25519"
    other = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path, "other")))
    known = tmp_path / "known_hosts"
    name = hostkeys.key_name(host.address, host.port)
    known.write_text(f"{name} ssh-ed25519 {other.get_base64()}\n")
    for mode in ("strict", "accept-new"):  # opting in to new keys never accepts a changed one
        t = SSHTransport(target_for(lab, host, known_hosts=str(known), host_keys=mode))
        error = expect_host_error(t.connect, r"HOST KEY CHANGED")
        assert error.hint and f'ssh-keygen -f {known} -R "{name}"' in error.hint
    assert known.read_text().count("\n") == 1


@pytest.mark.lab
def test_accept_new_records_the_key_then_strict_mode_trusts_it(lab: Any, tmp_path: Path) -> None:
    host = lab.hosts[1]
    known = tmp_path / "ssh" / "known_hosts"  # parent directory does not exist yet
    t = SSHTransport(target_for(lab, host, known_hosts=str(known), host_keys="accept-new"))
    assert t.run(["echo", "hi"]).stdout == b"hi\n"
    t.close()
    name = hostkeys.key_name(host.address, host.port)
    kind, key = server_key_line(lab, host)
    assert known.read_text() == f"{name} {kind} {key}\n"
    again = SSHTransport(target_for(lab, host, known_hosts=str(known)))
    assert again.run(["echo", "again"]).stdout == b"again\n"
    again.close()
    assert known.read_text().count("\n") == 1
    found = subprocess.run(
        ["ssh-keygen", "-F", name, "-f", str(known)], capture_output=True, text=True
    )
    assert found.returncode == 0, "OpenSSH must read the line we wrote"


# -- auth --------------------------------------------------------------------------------------


@pytest.mark.lab
def test_passphrase_key_without_agent_fails_fast_and_clearly(
    lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = make_key(tmp_path, "locked", passphrase="secret")
    t = SSHTransport(target_for(lab, lab.hosts[0], identity=str(key)))
    started = time.monotonic()
    error = expect_host_error(t.connect, rf"key {key} is passphrase-protected and no ssh-agent")
    assert time.monotonic() - started < 5
    assert error.hint and "ssh-add" in error.hint


@pytest.mark.lab
def test_unauthorized_key_names_user_host_and_key(
    lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = make_key(tmp_path, "stranger")
    host = lab.hosts[0]
    t = SSHTransport(target_for(lab, host, identity=str(key)))
    who = re.escape(f"{lab.user}@{host.address}")
    pattern = rf"authentication failed for {who} \(user={lab.user}, key={key}"
    expect_host_error(t.connect, pattern)


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.lab
def test_killed_sshd_refuses_new_connections_but_keeps_the_open_one(lab: Any) -> None:
    host = lab.hosts[-1]
    open_one = SSHTransport(target_for(lab, host))
    open_one.connect()
    lab.kill_sshd(host)
    try:
        fresh = SSHTransport(target_for(lab, host))
        error = expect_host_error(fresh.connect, r"connection refused by")
        assert error.hint and "sshd" in error.hint
        assert open_one.run(["echo", "still"]).stdout == b"still\n"
    finally:
        lab.start_sshd(host)
        open_one.close()


@pytest.mark.lab
@pytest.mark.isolated
def test_cut_link_fails_a_running_command_and_new_connects_quickly(lab: Any) -> None:
    host = lab.hosts[-2]
    t = SSHTransport(target_for(lab, host, connect_timeout=3.0))
    t.connect()
    outcome: dict[str, Any] = {}

    def long_run() -> None:
        try:
            outcome["result"] = t.run(["sleep", "120"])
        except HostError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    runner = threading.Thread(target=long_run, daemon=True)
    runner.start()
    time.sleep(0.5)
    lab.cut_link(host)
    cut_at = time.monotonic()
    try:
        runner.join(timeout=20)
        assert "error" in outcome, f"the run did not fail after the cut: {outcome}"
        detected = outcome["at"] - cut_at
        print(f"link cut detected after {detected:.1f} s")
        assert detected < 12
        assert "connection lost" in outcome["error"].message

        started = time.monotonic()
        fresh = SSHTransport(target_for(lab, host, connect_timeout=3.0))
        expect_host_error(fresh.connect, r"timed out connecting to .* after 3 s|no route")
        assert time.monotonic() - started < 5
    finally:
        lab.restore_link(host)
        kill_leftover(lab, host, "sleep 120")
    t.connect()  # a lost connection is replaced on the next call
    assert t.run(["echo", "back"]).stdout == b"back\n"
    t.close()


def kill_leftover(lab: Any, host: Any, cmdline: str) -> None:
    """A cut link leaves the remote command running (sshd never hears the client go): end it."""
    for p in lab.processes(host):
        if p.cmdline == cmdline:
            lab.run(host, ["kill", str(p.pid)])


# -- jump hosts --------------------------------------------------------------------------------


def assert_safe_chain(t: SSHTransport, hops: int) -> None:
    assert len(t._hops) == hops
    for hop in t._hops:
        assert isinstance(hop.client._policy, hostkeys.StrictPolicy)
    sock = t._hops[0].client.get_transport().sock
    first = getattr(sock, "wrapped", sock)  # under paramiko_tuning._ReadAhead when tuned
    assert isinstance(first, socket.socket)
    assert first.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert first.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
    assert first.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 8000


@pytest.mark.lab
@pytest.mark.isolated  # the bastion topology needs namespaces
def test_explicit_jump_through_the_bastion(bastion_lab: Any) -> None:
    b, host = bastion_lab.bastion, bastion_lab.hosts[0]
    jump = f"{bastion_lab.user}@{b.address}:{b.port}"
    t = SSHTransport(target_for(bastion_lab, host, jump=jump))
    try:
        assert t.run(["printf", "%s", "via bastion"]).stdout == b"via bastion"
        t.put(b"x", f"/tmp/tfdeploy-jump-{os.getpid()}")
        assert_safe_chain(t, 2)
    finally:
        t.close()


@pytest.mark.lab
@pytest.mark.isolated  # the bastion topology needs namespaces
def test_jump_from_an_ssh_config_proxyjump_alias(bastion_lab: Any) -> None:
    host = bastion_lab.hosts[1]
    t = SSHTransport(
        endpoint(
            host.name,
            host.name,  # an alias: HostName, User, IdentityFile, ProxyJump from the file
            known_hosts=str(bastion_lab.known_hosts),
            ssh_config=str(bastion_lab.ssh_config),
            connect_timeout=5,
        )
    )
    try:
        assert t.run(["echo", "aliased"]).stdout == b"aliased\n"
        assert_safe_chain(t, 2)
    finally:
        t.close()


@pytest.mark.lab
@pytest.mark.isolated  # the bastion topology needs namespaces
def test_unknown_jump_host_key_is_refused_and_named(bastion_lab: Any, tmp_path: Path) -> None:
    b, host = bastion_lab.bastion, bastion_lab.hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")
    jump = f"{bastion_lab.user}@{b.address}:{b.port}"
    t = SSHTransport(target_for(bastion_lab, host, jump=jump, known_hosts=str(known)))
    error = expect_host_error(t.connect, r"jump host .* host key of .* is not in")
    assert error.hint and f"ssh-keyscan -p {b.port} {b.address}" in error.hint


@pytest.mark.lab
@pytest.mark.isolated
def test_cut_link_to_the_bastion_fails_a_jumped_run(bastion_lab: Any) -> None:
    b, host = bastion_lab.bastion, bastion_lab.hosts[1]
    jump = f"{bastion_lab.user}@{b.address}:{b.port}"
    t = SSHTransport(target_for(bastion_lab, host, jump=jump))
    t.connect()
    errors: list[HostError] = []

    def long_run() -> None:
        try:
            t.run(["sleep", "120"])
        except HostError as exc:
            errors.append(exc)

    runner = threading.Thread(target=long_run, daemon=True)
    runner.start()
    time.sleep(0.5)
    bastion_lab.cut_link(b)
    cut_at = time.monotonic()
    try:
        runner.join(timeout=20)
        assert errors and "connection lost" in errors[0].message
        assert time.monotonic() - cut_at < 12
    finally:
        bastion_lab.restore_link(b)
        t.close()
        kill_leftover(bastion_lab, host, "sleep 120")


# -- ssh-agent and ssh_config precedence --------------------------------------------------------


@pytest.fixture
def agent_with_locked_key(lab: Any, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A real ssh-agent holding a passphrase-protected key that the lab hosts accept."""
    key = make_key(tmp_path, "locked", passphrase="pass phrase")
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho 'pass phrase'\n")
    askpass.chmod(0o700)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    env = {"SSH_AUTH_SOCK": str(sock)}
    authorized = lab.authorized_keys.read_text()
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        added = subprocess.run(
            ["ssh-add", str(key)],
            env=os.environ | env | {"SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
        )
        assert added.returncode == 0, added.stderr
        lab.authorized_keys.write_text(authorized + Path(f"{key}.pub").read_text())
        yield key, env
    finally:
        lab.authorized_keys.write_text(authorized)
        agent.kill()
        agent.wait()


@pytest.mark.lab
def test_passphrase_key_works_through_a_real_ssh_agent(
    lab: Any, agent_with_locked_key: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, env = agent_with_locked_key
    monkeypatch.setenv("SSH_AUTH_SOCK", env["SSH_AUTH_SOCK"])
    # The identity file cannot be read without its passphrase: the agent signs instead.
    t = SSHTransport(target_for(lab, lab.hosts[0], identity=str(key)))
    try:
        assert t.run(["echo", "via agent"]).stdout == b"via agent\n"
    finally:
        t.close()
    # And with no identity at all: the agent's key alone (default ~/.ssh names absent or refused).
    t = SSHTransport(target_for(lab, lab.hosts[1], identity=None))
    try:
        assert t.run(["echo", "agent only"]).stdout == b"agent only\n"
    finally:
        t.close()


@pytest.mark.lab
def test_passphrase_key_without_agent_never_waits_on_a_prompt(
    lab: Any, tmp_path: Path, lab_inventory: Any
) -> None:
    """The real CLI, with a terminal-less stdin and no agent: a clear error, fast, exit 3."""
    key = make_key(tmp_path, "locked2", passphrase="pp")
    inventory = lab_inventory(
        [[{"role": "worker"}]], job={"command": "true"}, ssh={"identity": str(key)}
    )
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "deployer", "up", str(inventory)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.PIPE,  # an open stdin nobody writes to: a prompt would hang here
        env=env | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")},
    )
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 30
    assert "passphrase-protected and no ssh-agent has it" in " ".join(result.stderr.split())


@pytest.mark.lab
def test_explicit_inventory_settings_win_over_ssh_config(lab: Any, tmp_path: Path) -> None:
    host = lab.hosts[2]
    nowhere = host.address.rsplit(".", 1)[0] + ".250"  # in the lab's subnet, no host there
    config = tmp_path / "ssh_config"
    # Everything in the file is wrong for this lab, except HostName.
    config.write_text(
        f"Host {host.name}\n  HostName {host.address}\n  User nobody\n"
        f"  IdentityFile {tmp_path}/no-such-key\n  ProxyJump nobody@{nowhere}\n"
    )
    t = SSHTransport(
        endpoint(
            host.name,
            host.name,
            port=host.port,  # 22 in the namespace lab; the file says none
            user=lab.user,
            identity=str(lab.key_path),
            jump="none",  # like OpenSSH's ProxyJump none: explicitly no jump host
            known_hosts=str(lab.known_hosts),
            ssh_config=str(config),
            connect_timeout=5,
        )
    )
    try:
        assert t.run(["id", "-un"]).stdout == f"{lab.user}\n".encode()
        assert len(t._hops) == 1
    finally:
        t.close()
    # Without the explicit settings the file's wrong values really apply (the test can fail).
    only_file = endpoint(
        host.name,
        host.name,
        known_hosts=str(lab.known_hosts),
        ssh_config=str(config),
        connect_timeout=2,
    )
    expect_host_error(SSHTransport(only_file).connect, rf"jump host nobody@{re.escape(nowhere)}")


# -- paramiko's two paths (hosts/paramiko_tuning.py) ------------------------------------------


@pytest.mark.lab
@pytest.mark.parametrize(
    ("env", "path"), [("", "tuned"), ("stock", "stock")], ids=["tuned", "stock"]
)
def test_both_paramiko_paths_carry_the_bytes_of_a_real_connection(
    lab: Any, env: str, path: str
) -> None:
    """Each in a process of its own: TFDEPLOY_PARAMIKO is read once, at import."""
    host = lab.hosts[0]
    settings = {k: v for k, v in target_for(lab, host).settings.__dict__.items() if v is not None}
    spec = {"name": host.name, "address": host.address, "settings": settings, "tag": path}
    environ = {**os.environ, "TFDEPLOY_PARAMIKO": env, "PYTHONPATH": str(Path.cwd())}
    probe = subprocess.run(
        [sys.executable, "-m", "tests.support.paramiko_probe", json.dumps(spec, default=list)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["path"] == path, found["why"]
    assert found["down_ok"] and found["up_ok"]
    ours = "deployer.hosts.paramiko_tuning."
    expected = {
        "transport": "paramiko.transport.Transport",
        "packetizer": "paramiko.packet.Packetizer",
        "socket": "socket.socket",
        "channel_buffer": "paramiko.buffered_pipe.BufferedPipe",
    }
    if path == "tuned":
        expected = {
            "transport": ours + "_Transport",
            "packetizer": ours + "_Packetizer",
            "socket": ours + "_ReadAhead",
            "channel_buffer": ours + "_PiecePipe",
        }
    assert {k: found[k] for k in expected} == expected
