"""The fan-out between hosts: a relay chain, so the controller's uplink carries the code once.

The controller streams the contents to the first host of the chain, the seed (`seed`); each
host stores every piece as it arrives and forwards the same piece at once to the next host of
the chain, which does the same. Contents flow while the chain fills: the last host has its copy
one uplink transfer plus a few pieces' time after the first byte left the controller, not N
copies.

`relay` leaves a detached listener on this host's cluster address for one stream, with the next
host to forward to; `close` stops it. The controller decides the chain (deployer/push/fanout.py);
this module only moves bytes, and trusts none of them:

- the sender proves it holds the run's secret (HMAC of the listener's fresh nonce) before the
  listener reads a byte; the secret comes in the request (over SSH), never on a command line,
  and is never logged or written down;
- every host hashes every content itself and publishes it only if its sha256 is the one named,
  so a damaged or tampered stream costs the hosts after it a star push, never a wrong file;
- a next host that fails mid-stream only ends the forwarding: this host still stores its copy;
- the listener lives until it has served one stream, `close`, or its own deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import daemon
import hostid
import layout
import params
import protocol
import store

MAX_SERVE_S = 600.0
MAX_HEADER = 16 * 1024 * 1024  # one line of contents: ~250k of them
GREETING = b"TFDP2"
IO_TIMEOUT_S = 10.0  # a hop silent this long mid-stream is given up (star push for the rest)
# Reaching the next host happens while the host before keeps sending: it must give up well
# before that sender's IO_TIMEOUT_S, or an unreachable next host takes this one down with it.
CONNECT_TIMEOUT_S = 3.0
REPLY_TIMEOUT_S = 120.0  # the next host's answer comes once the chain behind it stored all


def op_peers(req: dict[str, Any]) -> protocol.PeersReply:
    action = params.param(req, "action", str)
    workdir = layout.workdir_path(req)
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    record = layout.host_dir(workdir) / "peers" / f"{run_id}.json"
    if action == protocol.PEERS_RELAY:
        address = params.param(req, "address", str)
        port = params.param(req, "port", int)
        after = req.get("next")
        next_hop = hop_of(after) if after is not None else None
        seconds = min(float(params.param(req, "seconds", (int, float), 120.0)), MAX_SERVE_S)
        store_dir = layout.make_private_dir(workdir / "store")
        secret = secret_of(req)
        only = only_of(req)
        # The relay listens on a TF port, where the network check's stand-in may still be: a
        # host whose store was empty gets this as its first request after preflight.
        daemon.stop_stand_ins(req, run_id)
        return {"pid": listen(record, store_dir, address, port, secret, next_hop, seconds, only)}
    if action == protocol.PEERS_SEED:
        return seed(req, workdir)
    if action == protocol.PEERS_CLOSE:
        return {"closed": daemon.stop(record)}
    raise params.AgentError(f"peers action must be relay, seed or close, not {action!r}")


def only_of(req: dict[str, Any]) -> set[str] | None:
    """`store`: the contents this host keeps of the stream (absent: all of them); the others
    it checks and passes on to the next host without writing them."""
    kept = params.param(req, "store", list, None)
    return None if kept is None else {params.check_hash(h) for h in kept}


def secret_of(req: dict[str, Any]) -> bytes:
    text = params.param(req, "secret", str)
    if len(text) < 32 or any(c not in "0123456789abcdef" for c in text):
        raise params.AgentError("the run's secret must be at least 32 lowercase hex digits")
    return bytes.fromhex(text)


def hop_of(item: Any) -> tuple[str, int]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise params.AgentError(f"a hop is [address, port], not {item!r:.80}")
    port = item[1]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise params.AgentError(f"a hop's port must be 1-65535, got {port!r:.20}")
    return item[0], port


def _proof(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, b"tfdeploy-relay:" + nonce, hashlib.sha256).hexdigest()


# ---- the listening end -------------------------------------------------------------------------


def listen(
    record: Path,
    store_dir: Path,
    address: str,
    port: int,
    secret: bytes,
    next_hop: tuple[str, int] | None,
    seconds: float,
    only: set[str] | None = None,
) -> int:
    """Binds address:port (the cluster address only, never the wildcard), then waits in a
    detached process for the one stream of this push."""
    daemon.stop(record)  # a push of this run interrupted before its close
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(8)
    except OSError as exc:
        sock.close()
        raise params.AgentError(f"cannot listen on {address}:{port}: {exc.strerror}") from None
    deadline = time.monotonic() + seconds
    serve = lambda: _accept(sock, store_dir, secret, next_hop, deadline, only)  # noqa: E731
    pid = daemon.spawn(record, serve)
    sock.close()
    return pid


def _accept(
    sock: socket.socket,
    store_dir: Path,
    secret: bytes,
    next_hop: tuple[str, int] | None,
    deadline: float,
    only: set[str] | None = None,
) -> None:
    """Answers connections until one proves the secret and streams; strangers learn nothing.

    SIGTERM (`close`, a stop of the run) ends it at once, mid-stream too: the exception unwinds
    through the store's writer, which removes its partial file.
    """
    daemon.stop_on_sigterm()
    sock.settimeout(0.2)
    try:
        while time.monotonic() < deadline:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                if _relay_one(conn, store_dir, secret, next_hop, only):
                    break
            except (OSError, ValueError, params.AgentError):
                pass  # the sender sees the connection end and its hosts get the star push
            finally:
                conn.close()
    except daemon.Stopped:
        pass
    finally:
        sock.close()


def _relay_one(
    conn: socket.socket,
    store_dir: Path,
    secret: bytes,
    next_hop: tuple[str, int] | None,
    only: set[str] | None = None,
) -> bool:
    """One stream: checks the sender's proof, stores and forwards, answers. False for a
    connection that did not prove the secret (the listener waits on for the real one)."""
    conn.settimeout(IO_TIMEOUT_S)
    nonce = os.urandom(16)
    conn.sendall(GREETING + b" " + nonce.hex().encode() + b"\n")
    reader = conn.makefile("rb")
    proof, _, header = reader.readline(MAX_HEADER).partition(b" ")
    if not hmac.compare_digest(proof, _proof(secret, nonce).encode()):
        return False
    blobs = json.loads(header.decode()).get("blobs", [])
    reply = receive(store_dir, blobs, reader, secret, next_hop, only)
    conn.sendall(json.dumps(reply).encode() + b"\n")
    return True


def receive(
    store_dir: Path,
    blobs: list[Any],
    stream: BinaryIO,
    secret: bytes,
    next_hop: tuple[str, int] | None,
    only: set[str] | None = None,
) -> protocol.ChainReply:
    """Stores `blobs` from `stream` (those in `only`, when given), forwarding every piece to
    `next_hop` as it comes; returns this host's outcome followed by those of the hosts after
    it."""
    forward = Forward(next_hop, secret, blobs) if next_hop is not None else None
    error = ""
    try:
        store.receive(store_dir, blobs, stream, forward.send if forward else None, only)
    except (OSError, ValueError, params.AgentError) as exc:
        error = str(exc)
    mine: protocol.ChainEntry = {"host": hostid.identity(), "error": error}
    return {"chain": [mine, *(forward.finish() if forward else [])]}


def seed(req: dict[str, Any], workdir: Path) -> protocol.ChainReply:
    """Stores the contents streamed after the request, forwarding every piece to `next` as it
    comes; answers this host's outcome and those of the chain after it."""
    blobs = params.param(req, "blobs", list)
    forward = Forward(hop_of(params.param(req, "next", list)), secret_of(req), blobs)
    store_dir = layout.make_private_dir(workdir / "store")
    try:
        store.receive(store_dir, blobs, sys.stdin.buffer, forward.send, only_of(req))
    except (OSError, ValueError, params.AgentError) as exc:
        forward.close()  # the hosts after this one see their stream end early
        raise params.StreamError.of(exc) from exc
    return {"chain": [{"host": hostid.identity(), "error": ""}, *forward.finish()]}


class Forward:
    """The stream to the next host: pieces go out as they arrive here. A next host that fails
    only ends the forwarding; its outcome (and of those after it) says what happened."""

    def __init__(self, hop: tuple[str, int], secret: bytes, blobs: list[Any]) -> None:
        self.hop = hop
        self.error = ""
        self.conn: socket.socket | None = None
        try:
            conn = socket.create_connection(hop, timeout=CONNECT_TIMEOUT_S)
            conn.settimeout(IO_TIMEOUT_S)
            reader = conn.makefile("rb")
            greeting = reader.readline(256).split()
            if len(greeting) != 2 or greeting[0] != GREETING:
                raise ValueError("not a tfdeploy relay")
            proof = _proof(secret, bytes.fromhex(greeting[1].decode()))
            conn.sendall(proof.encode() + b" " + json.dumps({"blobs": blobs}).encode() + b"\n")
            self.conn, self.reader = conn, reader
        except (OSError, ValueError) as exc:
            self.error = _why(exc)

    def send(self, piece: bytes) -> None:
        if self.conn is None:
            return
        try:
            self.conn.sendall(piece)
        except OSError as exc:
            self.error = _why(exc)
            self.close()

    def finish(self) -> list[protocol.ChainEntry]:
        """The outcomes of the hosts from the next one on."""
        if self.conn is None:
            return [{"hop": list(self.hop), "error": self.error or "not reached"}]
        try:
            self.conn.settimeout(REPLY_TIMEOUT_S)
            line = self.reader.readline(MAX_HEADER)
            chain = json.loads(line.decode())["chain"] if line else None
        except (OSError, ValueError, KeyError) as exc:
            chain, self.error = None, _why(exc)
        finally:
            self.close()
        if not isinstance(chain, list):
            return [{"hop": list(self.hop), "error": self.error or "the stream ended early"}]
        return chain

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _why(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
