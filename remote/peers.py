"""The fan-out between hosts: a relay chain, so the controller's uplink carries the code once.

The controller streams the contents to the first host of the chain, the seed (`seed`); each
host stores every piece as it arrives and forwards the same piece at once to the next host of
the chain, which does the same. Contents flow while the chain fills: the last host has its copy
one uplink transfer plus a few pieces' time after the first byte left the controller, not N
copies.

The seed's stream may begin before the chain exists: on a first deploy the controller starts it
as soon as that host's hello is answered, while the others are still being greeted and checked,
and names the next host later (`onward`). Until then the seed only stores; once named, it
replays what it has stored so far to the next host, then forwards each piece as it comes.

`relay` leaves a detached listener on this host's cluster address for one stream, with the next
host to forward to; `close` stops it. The controller decides the chain (deployer/push/fanout.py);
this module only moves bytes, and trusts none of them:

- the sender proves it holds the run's secret (HMAC of the listener's fresh nonce) before the
  listener reads a byte; the secret comes in the request (over SSH), never on a command line,
  and is never logged or written down;
- every host hashes every content itself and publishes it only if its sha256 is the one named,
  so a damaged or tampered stream costs the hosts after it a star push, never a wrong file;
- a next host that fails mid-stream only ends the forwarding: this host still stores its copy;
- the listener lives until it has served one stream, `close`, or its own deadline; a seed
  waiting to be told where to forward ends with its session or its deadline.
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

LOOK_S = 0.02  # how often a seed mid-stream looks whether its next host has been named
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
        # The relay listens on a TF port, where the network check's stand-in may still be: a
        # host whose store was empty gets this as its first request after preflight.
        layout.stop_stand_ins(req, run_id)
        return {"pid": listen(record, store_dir, address, port, secret, next_hop, seconds)}
    if action == protocol.PEERS_SEED:
        return seed(req, workdir, record.parent, run_id)
    if action == protocol.PEERS_ONWARD:
        after = req.get("next")
        notice = _notice(record.parent, run_id, req)
        layout.make_private_dir(notice.parent)
        layout.write_json(notice, {"next": list(hop_of(after)) if after is not None else None})
        return {}
    if action == protocol.PEERS_CLOSE:
        for stale in record.parent.glob(f"{run_id}.*.onward"):  # a seed that ended first
            stale.unlink(missing_ok=True)
        return {"closed": daemon.stop(record)}
    raise params.AgentError(f"peers action must be relay, seed, onward or close, not {action!r}")


def _notice(records: Path, run_id: str, req: dict[str, Any]) -> Path:
    """Where `onward` tells one seed stream its next host (no secret in it: the seed has it)."""
    stream = params.check_name(params.param(req, "stream", str), "stream id")
    return records / f"{run_id}.{stream}.onward"


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
    serve = lambda: _accept(sock, store_dir, secret, next_hop, deadline)  # noqa: E731
    pid = daemon.spawn(record, serve)
    sock.close()
    return pid


def _accept(
    sock: socket.socket,
    store_dir: Path,
    secret: bytes,
    next_hop: tuple[str, int] | None,
    deadline: float,
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
                if _relay_one(conn, store_dir, secret, next_hop):
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
    conn: socket.socket, store_dir: Path, secret: bytes, next_hop: tuple[str, int] | None
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
    reply = receive(store_dir, blobs, reader, secret, next_hop)
    conn.sendall(json.dumps(reply).encode() + b"\n")
    return True


def receive(
    store_dir: Path,
    blobs: list[Any],
    stream: BinaryIO,
    secret: bytes,
    next_hop: tuple[str, int] | None,
) -> dict[str, Any]:
    """Stores `blobs` from `stream`, forwarding every piece to `next_hop` as it comes; returns
    this host's outcome followed by those of the hosts after it."""
    forward = Forward(next_hop, secret, blobs) if next_hop is not None else None
    error = ""
    try:
        store.receive(store_dir, blobs, stream, forward.send if forward else None)
    except (OSError, ValueError, params.AgentError) as exc:
        error = str(exc)
    mine = {"host": hostid.identity(), "error": error}
    return {"chain": [mine, *(forward.finish() if forward else [])]}


def seed(req: dict[str, Any], workdir: Path, records: Path, run_id: str) -> dict[str, Any]:
    """Stores the contents streamed after the request, forwarding them to `next`, or to the
    host a later `onward` names; answers this host's outcome and those of the chain after it."""
    blobs = params.param(req, "blobs", list)
    secret = secret_of(req)
    after = req.get("next")
    seconds = min(float(params.param(req, "seconds", (int, float), 120.0)), MAX_SERVE_S)
    notice = _notice(records, run_id, req) if after is None else None
    handover = Handover(layout.make_private_dir(workdir / "store"), blobs, secret, notice)
    try:
        if after is not None:
            handover.begin(hop_of(after))
        store.receive(handover.store_dir, blobs, sys.stdin.buffer, handover.piece, handover.source)
        handover.complete(time.monotonic() + seconds)
    except (OSError, ValueError, params.AgentError) as exc:
        handover.abandon()  # the hosts after this one see their stream end early
        raise params.StreamError(str(exc)) from exc
    finally:
        if notice is not None:
            notice.unlink(missing_ok=True)
    return {"chain": [{"host": hostid.identity(), "error": ""}, *handover.outcomes()]}


class Handover:
    """The seed's side of the chain: every piece goes on to the next host once it is known.

    A next host named mid-stream first gets what arrived before, read back from the store (the
    contents complete) and from the file the current one is being written to (store.receive's
    `source`), then the pieces as they come: the stream it sees is the one it would have seen
    from the start.
    """

    def __init__(
        self, store_dir: Path, blobs: list[Any], secret: bytes, notice: Path | None
    ) -> None:
        self.store_dir, self.blobs, self.secret, self.notice = store_dir, blobs, secret, notice
        self.forward: Forward | None = None
        self.decided = notice is None
        self.sources: list[Path] = []  # where each content began to be written, in order
        self.offset = 0  # bytes of the last of them received so far
        self.done = False  # every content is in the store
        self._look_at = 0.0

    def begin(self, hop: tuple[str, int]) -> None:
        self.forward, self.decided = Forward(hop, self.secret, self.blobs), True

    def source(self, path: Path) -> None:
        self.sources.append(path)
        self.offset = 0
        self._look()

    def piece(self, data: bytes) -> None:
        self._look()
        if self.forward is not None:
            self.forward.send(data)
        self.offset += len(data)

    def complete(self, deadline: float) -> None:
        """Every content is stored: waits until the next host is named (or none is), the
        controller leaves, or `deadline`."""
        import caller

        self.done = True
        while not self.decided:
            self._look_at = 0.0
            self._look()
            if self.decided:
                break
            caller.check()
            if time.monotonic() > deadline:
                raise params.AgentError("the controller never named the host to forward to")
            time.sleep(LOOK_S)

    def _look(self) -> None:
        if self.decided or time.monotonic() < self._look_at or self.notice is None:
            return
        self._look_at = time.monotonic() + LOOK_S
        told = layout.read_json(self.notice)
        if not isinstance(told, dict):
            return  # not yet (or half-written: write_json renames, so never seen)
        after = told.get("next")
        if after is None:
            self.decided = True  # no chain after all: this host only stores
            return
        self.begin(hop_of(after))
        self._replay()

    def _replay(self) -> None:
        """What arrived before the next host was named, in the order it arrived."""
        for index, path in enumerate(self.sources):
            digest, size = params.check_hash(self.blobs[index][0]), self.blobs[index][1]
            if index < len(self.sources) - 1 or self.done:
                self._send_file(self.store_dir / digest, size)  # complete: in the store
            else:
                self._send_file(path, self.offset)  # its part so far, as written

    def _send_file(self, path: Path, size: int) -> None:
        assert self.forward is not None
        with open(path, "rb") as f:
            while size > 0 and self.forward.conn is not None:  # not once the next host failed
                data = f.read(min(store.CHUNK, size))
                if not data:
                    break
                self.forward.send(data)
                size -= len(data)

    def abandon(self) -> None:
        if self.forward is not None:
            self.forward.close()

    def outcomes(self) -> list[dict[str, Any]]:
        return self.forward.finish() if self.forward is not None else []


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

    def finish(self) -> list[dict[str, Any]]:
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
