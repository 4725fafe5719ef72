"""The keeper's wire (remote/keepwire.py): a request is believed only with a proof of the run's
secret over the nonce of its own connection, and a reply only with one over the same nonce."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from remote import keepwire

SECRET = bytes.fromhex("ab" * 32)


def _warden(
    answer: Callable[[socket.socket, bytes], None],
) -> Iterator[tuple[int, list[object]]]:
    """A one-connection-at-a-time server speaking the warden's side with `answer`."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    seen: list[object] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                nonce = keepwire.new_nonce()
                conn.sendall(keepwire.GREETING + nonce + b"\n")
                try:
                    line = keepwire.read_line(conn)
                    seen.append(keepwire.verified(SECRET, keepwire.ASK, nonce, "request", line))
                except keepwire.WireError as exc:
                    seen.append(exc)
                    continue
                answer(conn, nonce)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port, seen
    finally:
        server.close()


def _honest(conn: socket.socket, nonce: bytes) -> None:
    conn.sendall(keepwire.signed(SECRET, keepwire.ANSWER, nonce, "reply", {"ok": True}))


@pytest.fixture
def honest() -> Iterator[tuple[int, list[object]]]:
    yield from _warden(_honest)


def test_a_proved_request_gets_a_proved_reply(honest: tuple[int, list[object]]) -> None:
    port, seen = honest
    assert keepwire.ask("127.0.0.1", port, SECRET, {"ask": "poll"}, 5) == {"ok": True}
    assert seen == [{"ask": "poll"}]


def test_a_wrong_secret_proves_nothing(honest: tuple[int, list[object]]) -> None:
    port, seen = honest
    with pytest.raises((keepwire.WireError, OSError)):
        keepwire.ask("127.0.0.1", port, bytes(32), {"ask": "stop"}, 5)
    assert isinstance(seen[0], keepwire.WireError)
    assert "proof" in str(seen[0])


def test_a_recorded_request_replays_nowhere(honest: tuple[int, list[object]]) -> None:
    """The proof binds the request to one connection's nonce: sent again on a new connection
    (a host that saw it, replaying it), it is refused."""
    port, seen = honest
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        nonce = keepwire.read_line(sock)[len(keepwire.GREETING) :]
        recorded = keepwire.signed(SECRET, keepwire.ASK, nonce, "request", {"ask": "stop"})
        sock.sendall(recorded)
        keepwire.read_line(sock)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        keepwire.read_line(sock)
        sock.sendall(recorded)
        with pytest.raises(keepwire.WireError):
            keepwire.read_line(sock)  # closed without an answer
    assert seen[0] == {"ask": "stop"} and isinstance(seen[1], keepwire.WireError)


def test_a_reply_not_proved_for_this_nonce_is_not_believed() -> None:
    def forger(conn: socket.socket, nonce: bytes) -> None:
        other = keepwire.new_nonce()
        conn.sendall(keepwire.signed(SECRET, keepwire.ANSWER, other, "reply", {"ok": True}))

    for port, _ in _warden(forger):
        with pytest.raises(keepwire.WireError, match="proof"):
            keepwire.ask("127.0.0.1", port, SECRET, {"ask": "poll"}, 5)


@pytest.mark.parametrize(
    "line",
    [b"[" * 5000 + b"\n", b"x" * (keepwire.MAX_LINE + 10), json.dumps([1, 2]).encode() + b"\n"],
    ids=["deep", "endless", "no-object"],
)
def test_a_hostile_line_is_a_wire_error_never_a_crash(line: bytes) -> None:
    def hostile(conn: socket.socket, nonce: bytes) -> None:
        conn.sendall(line)

    for port, _ in _warden(hostile):
        with pytest.raises(keepwire.WireError):
            keepwire.ask("127.0.0.1", port, SECRET, {"ask": "poll"}, 5)
