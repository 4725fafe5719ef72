"""The transport layer without the lab: known_hosts writing, readable connect errors, the local
transport, and the guard that no code accepts unknown host keys (against real sshd hosts:
tests/integration/test_transport.py).
"""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tokenize
from pathlib import Path
from typing import Any

import paramiko
import pytest

from deployer.hosts import hostkeys
from deployer.hosts.local_transport import LocalTransport
from deployer.hosts.ssh_transport import SSHTransport
from deployer.hosts.transport import OutputTooLarge, render
from tests.support.transport import HOSTILE, endpoint, expect_host_error, make_key

ROOT = Path(__file__).resolve().parents[2]


# -- host keys ---------------------------------------------------------------------------------


def test_accept_new_writes_bracketed_names_for_other_ports(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path, "k")))
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.9 ssh-ed25519 " + key.get_base64())  # no final newline
    hostkeys.append_known_host(str(known), "[10.0.0.1]:2222", key)
    hostkeys.append_known_host(str(known), "[10.0.0.1]:2222", key)  # a second writer: no-op
    lines = known.read_text().splitlines()
    assert lines[1] == f"[10.0.0.1]:2222 ssh-ed25519 {key.get_base64()}"
    assert len(lines) == 2


def test_a_client_gets_the_keys_paramiko_would_pick_for_its_host(tmp_path: Path) -> None:
    a = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path, "a")))
    b = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path, "b")))
    known = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("[10.0.0.2]:2222")
    known.write_text(
        "# a comment\n"
        f"10.0.0.1,h1 ssh-ed25519 {a.get_base64()}\n"
        f"10.0.0.1 ssh-ed25519 {b.get_base64()}\n"  # a second key of the same type: not used
        f"{hashed} ssh-ed25519 {b.get_base64()}\n"
        "garbage line\n"
    )
    for name in ("10.0.0.1", "h1", "[10.0.0.2]:2222", "10.0.0.3"):
        client = paramiko.SSHClient()
        hostkeys.configure_client("h", client, str(known), "strict", name=name)
        reference = paramiko.HostKeys(str(known)).lookup(name)
        got = client.get_host_keys().lookup(name)
        assert (dict(got) if got else None) == (dict(reference) if reference else None), name
    # a changed file is read again (a new key recorded meanwhile, e.g. by accept-new)
    known.write_text(f"10.0.0.3 ssh-ed25519 {a.get_base64()}\n")
    client = paramiko.SSHClient()
    hostkeys.configure_client("h", client, str(known), "strict", name="10.0.0.3")
    assert dict(client.get_host_keys().lookup("10.0.0.3")) == {"ssh-ed25519": a}
    assert client.get_host_keys().lookup("10.0.0.1") is None  # only its own host's keys


# -- auth --------------------------------------------------------------------------------------


def test_unresolvable_and_missing_key_are_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one seam in this file: a real lookup of an unknown name asks this machine's resolver,
    # outside the lab, and tests send nothing outside it. The name fails as glibc fails it.
    real = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "no-such-host.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    bad = endpoint("ghost", "no-such-host.invalid", ssh_config=os.devnull, connect_timeout=2)
    expect_host_error(SSHTransport(bad).connect, r"could not resolve hostname no-such-host")
    missing = endpoint("h", "127.0.0.1", identity=str(tmp_path / "nope"), ssh_config=os.devnull)
    expect_host_error(SSHTransport(missing).connect, r"identity file .*nope does not exist")


# -- local -------------------------------------------------------------------------------------


def test_local_run_and_hostile_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A PATH folder this user cannot search (root's /root/.cargo/bin, kept by `su user -c`) makes
    # exec fail with EACCES, which the transport reports as 126 (permission denied): the
    # not-found case below wants a PATH of folders this user can search.
    path = os.environ.get("PATH", os.defpath).split(os.pathsep)
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in path if os.access(d or ".", os.X_OK)))
    local = LocalTransport("here")
    result = local.run(["sh", "-c", "cat; echo oops >&2; exit 7"], stdin=b"in\x00put")
    assert result == type(result)(7, b"in\x00put", b"oops\n")
    marker = tmp_path / "MARK"
    for raw in HOSTILE:
        arg = raw.replace("MARK", str(marker))
        assert local.run(["printf", "%s", arg]).stdout == arg.encode()
    assert not marker.exists()
    assert local.run(["no-such-program-tfdeploy"]).exit_code == 127
    big = local.run(["head", "-c", "8000000", "/dev/zero"])
    assert len(big.stdout) == 8_000_000


def test_local_timeout_kills_the_whole_group() -> None:
    local = LocalTransport("here")
    started = time.monotonic()
    expect_host_error(
        lambda: local.run(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5), r"timed out after"
    )
    assert time.monotonic() - started < 3


def test_local_output_past_max_output_ends_the_command_unbuffered() -> None:
    """A command that prints without end (a hostile wrapper on a login node) is ended once
    stdout and stderr together pass max_output: nothing reads it all into memory first."""
    t = LocalTransport("here")
    script = "import sys\nwhile 1: sys.stdout.write('y' * 65536)"
    with pytest.raises(OutputTooLarge, match=r"printed more than 1000000 bytes"):
        t.run([sys.executable, "-c", script], max_output=1_000_000, timeout=60)
    assert t.run(["echo", "ok"], max_output=10).stdout == b"ok\n"  # under the bound: as before


def test_local_put_is_atomic_with_mode(tmp_path: Path) -> None:
    local = LocalTransport("here")
    path = tmp_path / "a" / "b" / "f"
    local.put(b"one", str(path))
    assert path.read_bytes() == b"one" and (path.stat().st_mode & 0o777) == 0o600
    inode = path.stat().st_ino
    local.put(b"two", str(path), mode=0o755)
    assert path.read_bytes() == b"two" and (path.stat().st_mode & 0o777) == 0o755
    assert path.stat().st_ino != inode
    assert sorted(os.listdir(path.parent)) == ["f"]
    with pytest.raises(ValueError):
        local.put(b"x", "relative/path")


def test_argv_is_quoted_once() -> None:
    assert render(["printf", "%s", "a b", "$(x)"]) == "printf %s 'a b' '$(x)'"
    with pytest.raises(ValueError):
        render([])


def test_local_commands_get_a_login_environment_not_the_controllers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "controller-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    local = LocalTransport("here")
    lines = local.run(["env"]).stdout.decode().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"]
    assert env["LC_ALL"] == "C.UTF-8"
    session = local.open_session(["sh", "-c", "read x; env | grep -c SECRET; read y"])
    try:
        assert session.request(b"go\n", timeout=10) == b"0\n"
    finally:
        session.close()


def _one_host_at(
    tmp_path: Path, name: str, port: int, verb: str
) -> subprocess.CompletedProcess[str]:
    """`tfdeploy VERB` of a one-worker job on a host at 127.0.0.1:port, waiting 1 s to connect."""
    inventory = tmp_path / "inv.toml"
    (tmp_path / "code").mkdir()
    inventory.write_text(
        f'[job]\nname = "{name}"\ncode = "code"\ncommand = "true"\n'
        f'[ssh]\nconnect_timeout = 1\nssh_config = "{os.devnull}"\n'
        f'known_hosts = "{tmp_path / "known_hosts"}"\nhost_keys = "accept-new"\n'
        f'[[hosts]]\nname = "{name}"\naddress = "127.0.0.1"\nssh = {{ port = {port} }}\n'
        'tasks = [{ role = "worker" }]\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "deployer", verb, str(inventory)],
        capture_output=True,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")},
        timeout=60,
    )


def test_a_port_that_never_speaks_ssh_gives_one_clean_error_and_no_paramiko_log(
    tmp_path: Path,
) -> None:
    """paramiko logs the failed banner read with tracebacks; none of it may reach the user."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        done = _one_host_at(tmp_path, "mute", silent.getsockname()[1], "up")
    output = done.stdout + done.stderr
    assert done.returncode == 3, output  # a host could not be reached: nothing started
    assert "mute" in output and "no SSH banner within 1 s" in output, output
    assert "Traceback" not in output and "Exception (client)" not in output, output


def test_a_port_that_sends_a_banner_then_nothing_says_the_key_exchange_never_finished(
    tmp_path: Path,
) -> None:
    """A hung sshd (or a firewall that drops what follows the first packets) sends its banner
    and goes silent: paramiko's "No existing session" named nothing the user could act on."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        accepted: list[socket.socket] = []

        def banner_then_nothing() -> None:
            conn, _ = server.accept()
            accepted.append(conn)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        threading.Thread(target=banner_then_nothing, daemon=True).start()
        done = _one_host_at(tmp_path, "hung", port, "check")
        for conn in accepted:
            conn.close()
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "hung: SSH handshake with 127.0.0.1" in output, output
    assert "sent an SSH banner, then nothing for 2 s" in output, output
    assert "No existing session" not in output and "Traceback" not in output, output


def test_an_empty_home_is_not_the_root_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOME="" made `~/x` mean `/x`; a login would take the home from the passwd entry."""
    import pwd

    from deployer.hosts.agent import Agent

    home = pwd.getpwuid(os.getuid()).pw_dir
    monkeypatch.setenv("HOME", "")
    local = LocalTransport("here")
    assert local.run(["sh", "-c", 'echo "$HOME"']).stdout.decode().strip() == home
    workdir = f"~/.tfdeploy-test-home-{os.getpid()}"
    try:
        facts = Agent(local, python=sys.executable, workdir=workdir).install()
        assert facts["workdir"] == f"{home}/{workdir[2:]}"
    finally:
        import shutil

        shutil.rmtree(f"{home}/{workdir[2:]}", ignore_errors=True)
    assert not os.path.exists(f"/{workdir[2:]}")


# -- guard -------------------------------------------------------------------------------------

FORBIDDEN_NAMES = {"AutoAddPolicy", "WarningPolicy"}
FORBIDDEN_TEXT = re.compile(r"StrictHostKeyChecking\s*[= ]\s*no", re.IGNORECASE)
# The only place allowed to install a host-key policy: the explicit accept-new opt-in lives there.
POLICY_MODULE = ROOT / "deployer" / "hosts" / "hostkeys.py"


def test_no_code_accepts_unknown_host_keys_silently() -> None:
    offenders = []
    for path in sorted([*ROOT.glob("deployer/**/*.py"), *ROOT.glob("remote/**/*.py")]):
        text = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            where = f"{path.relative_to(ROOT)}:{tok.start[0]}"
            if tok.type == tokenize.NAME and tok.string in FORBIDDEN_NAMES:
                offenders.append(f"{where}: {tok.string}")
            if tok.type == tokenize.STRING and FORBIDDEN_TEXT.search(tok.string):
                offenders.append(f"{where}: StrictHostKeyChecking=no")
            policy_call = tok.string in ("set_missing_host_key_policy", "MissingHostKeyPolicy")
            if tok.type == tokenize.NAME and policy_call and path != POLICY_MODULE:
                offenders.append(f"{where}: host-key policy outside {POLICY_MODULE.name}")
    assert not offenders, "unknown host keys must never be accepted silently:\n" + "\n".join(
        offenders
    )
