"""How a refused SSH login is said when the server said why: a Slurm node whose
`pam_slurm_adopt` admits only users with a job running there (docs/slurm.md, `reach = "ssh"`).

OpenSSH accepts the key, then asks PAM's account stack; pam_slurm_adopt's "Access denied by
pam_slurm_adopt: you have no active jobs on this node" comes back as the userauth banner, and the
login fails (seen on the lab: tests/integration/test_slurm_adopt.py). Here an in-process paramiko
server does the same: it sends that banner and refuses the key. Without the banner the same
refusal is the plain "authentication failed" with its authorized_keys hint.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from deployer.core.errors import HostError
from deployer.hosts import ssh
from tests.support.transport import endpoint, make_key

ADOPT_SAID = "Access denied by pam_slurm_adopt: you have no active jobs on this node\n"
Serve = Callable[[str], tuple[str, int, Path]]


class _Refusing(paramiko.ServerInterface):
    """Accepts nothing; says `banner` before the first authentication answer, as sshd does."""

    def __init__(self, banner: str) -> None:
        self.banner = banner

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_FAILED

    def get_banner(self) -> tuple[str | None, str | None]:
        return (self.banner or None), "en-US"


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[tuple[Serve, Path]]:
    """`serve(banner)`: a one-connection server on loopback that refuses every key after
    saying `banner`; returns (address, port, known_hosts) for it."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []
    transports: list[paramiko.Transport] = []
    host_key = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path, "host_key")))

    def serve(banner: str) -> tuple[str, int, Path]:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            transport = paramiko.Transport(conn)
            transports.append(transport)
            transport.add_server_key(host_key)
            transport.start_server(server=_Refusing(banner))

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        threads.append(thread)
        known = tmp_path / f"known_hosts-{port}"
        known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
        return "127.0.0.1", port, known

    yield serve, tmp_path
    for thread in threads:
        thread.join(timeout=10)
    for transport in transports:
        transport.close()
    for listener in listeners:
        listener.close()


def _login(serve: Serve, tmp_path: Path, banner: str) -> HostError:
    address, port, known = serve(banner)
    key = make_key(tmp_path, f"user_key_{port}")
    target = endpoint(
        "h2",
        address,
        user="alice",
        port=port,
        identity=str(key),
        known_hosts=str(known),
        host_keys="strict",
        connect_timeout=5,
    )
    hops = ssh.plan_hops(target)
    with pytest.raises(HostError) as info:
        ssh.open_hops(target, hops)
    return info.value


def test_a_node_whose_pam_slurm_adopt_refused_is_named_with_the_cause_and_the_fix(
    refusing: tuple[Serve, Path],
) -> None:
    serve, tmp_path = refusing
    error = _login(serve, tmp_path, ADOPT_SAID)
    message = error.message
    assert message.startswith("h2: 127.0.0.1 refused alice's SSH session"), message
    assert "pam_slurm_adopt admits only users with a Slurm job running on it" in message
    assert message.endswith(f"; the node says: {ADOPT_SAID.strip()}"), message  # its words
    assert "authentication failed" not in message and "authorized_keys" not in (error.hint or "")
    hint = error.hint or ""
    assert "only while a job of alice's runs there" in hint, hint
    assert "tfdeploy status INVENTORY" in hint and "tfdeploy up" in hint, hint


def test_without_the_modules_words_a_refusal_stays_an_authentication_failure(
    refusing: tuple[Serve, Path],
) -> None:
    serve, tmp_path = refusing
    for banner in ("", "Authorized users only. All activity may be monitored.\n"):
        error = _login(serve, tmp_path, banner)
        assert "authentication failed for alice@127.0.0.1" in error.message, error.message
        assert "pam_slurm_adopt" not in error.message
        assert "authorized_keys" in (error.hint or "")


def test_the_quoted_banner_is_cleaned_and_cut(
    refusing: tuple[Serve, Path],
) -> None:
    """The banner is the host's text: what reaches the terminal is one clean line, bounded."""
    serve, tmp_path = refusing
    hostile = "\x1b[2J\x1b]0;owned\x07Access denied by pam_slurm_adopt:\r\n" + "x" * 5000
    error = _login(serve, tmp_path, hostile)
    said = error.message.split("; the node says: ", 1)[1]
    assert "\x1b" not in said and "\x07" not in said and "\n" not in said and "\r" not in said
    assert said.startswith("Access denied by pam_slurm_adopt:"), said
    assert len(said) <= ssh._BANNER_SHOWN, len(said)
