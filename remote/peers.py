"""Hosts copying store contents to each other, so the controller's uplink carries them once.

`serve` leaves a detached server on the host's cluster address; `fetch` asks peers for the
contents this host lacks; `close` stops the server. The controller decides who serves whom
(deployer/push/fanout.py); this module only moves bytes, and trusts none of them:

- a client proves it holds the run's secret (HMAC of the server's fresh nonce) before the
  server sends anything, so nothing in the store is served to anyone outside the run; the
  secret comes in the request (over SSH), never on a command line, and is never logged;
- every content is hashed as it arrives and enters the store only if its sha256 is the one
  asked for, so a tampering or confused peer costs a retry elsewhere, never a wrong file;
- the server lives until `close` or its own deadline, whichever comes first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import daemon
import layout
import params
import protocol
import store

MAX_SERVE_S = 600.0
MAX_REQUEST = 16 * 1024 * 1024  # one line of wanted hashes: ~250k contents
CHUNK = 1024 * 1024
GREETING = b"TFDP1"
IO_TIMEOUT_S = 10.0  # a peer silent this long mid-transfer is given up for the next one


def op_peers(req: dict[str, Any]) -> dict[str, Any]:
    action = params.param(req, "action", str)
    workdir = layout.workdir_path(req)
    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    record = layout.host_dir(workdir) / "peers" / f"{run_id}.json"
    if action == protocol.PEERS_SERVE:
        address = params.param(req, "address", str)
        port = params.param(req, "port", int)
        seconds = min(float(params.param(req, "seconds", (int, float), 120.0)), MAX_SERVE_S)
        return {"pid": serve(record, workdir / "store", address, port, _secret(req), seconds)}
    if action == protocol.PEERS_FETCH:
        blobs = [_blob(item) for item in params.param(req, "blobs", list)]
        peers = [_peer(item) for item in params.param(req, "peers", list)]
        wait = float(params.param(req, "wait", (int, float), 3.0))
        return fetch(layout.make_private_dir(workdir / "store"), blobs, peers, _secret(req), wait)
    if action == protocol.PEERS_CLOSE:
        return {"closed": daemon.stop(record)}
    raise params.AgentError(f"peers action must be serve, fetch or close, not {action!r}")


def _secret(req: dict[str, Any]) -> bytes:
    text = params.param(req, "secret", str)
    if len(text) < 32 or any(c not in "0123456789abcdef" for c in text):
        raise params.AgentError("the run's secret must be at least 32 lowercase hex digits")
    return bytes.fromhex(text)


def _blob(item: Any) -> tuple[str, int]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], int)):
        raise params.AgentError(f"each blob is [sha256, size], not {item!r:.80}")
    return params.check_hash(item[0]), item[1]


def _peer(item: Any) -> tuple[str, int]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise params.AgentError(f"each peer is [address, port], not {item!r:.80}")
    port = item[1]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise params.AgentError(f"a peer's port must be 1-65535, got {port!r:.20}")
    return item[0], port


# ---- serving ----------------------------------------------------------------------------------


def serve(
    record: Path, store_dir: Path, address: str, port: int, secret: bytes, seconds: float
) -> int:
    """Binds address:port (the cluster address only, never the wildcard), then serves from a
    detached process until `close` or `seconds` pass."""
    daemon.stop(record)  # a push of this run interrupted before its close
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise params.AgentError(f"cannot serve on {address}:{port}: {exc.strerror}") from None
    deadline = time.monotonic() + seconds
    pid = daemon.spawn(record, lambda: _accept(sock, store_dir, secret, deadline))
    sock.close()
    return pid


def _accept(sock: socket.socket, store_dir: Path, secret: bytes, deadline: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sock.settimeout(0.2)
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        threading.Thread(target=_answer, args=(conn, store_dir, secret), daemon=True).start()
    sock.close()


def _answer(conn: socket.socket, store_dir: Path, secret: bytes) -> None:
    """One client: its proof of the secret, then each wanted content (or that it is missing)."""
    try:
        conn.settimeout(IO_TIMEOUT_S)
        nonce = os.urandom(16)
        conn.sendall(GREETING + b" " + nonce.hex().encode() + b"\n")
        reader = conn.makefile("rb")
        line = reader.readline(MAX_REQUEST)
        proof, _, request = line.partition(b" ")
        if not hmac.compare_digest(proof, _proof(secret, nonce).encode()):
            return  # not of this run: it learns nothing, not even which contents exist
        for digest in json.loads(request.decode()).get("want", []):
            _send(conn, store_dir, params.check_hash(digest))
    except (OSError, ValueError, params.AgentError):
        pass  # the client sees the connection end and asks another peer
    finally:
        conn.close()


def _proof(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, b"tfdeploy-fetch:" + nonce, hashlib.sha256).hexdigest()


def _send(conn: socket.socket, store_dir: Path, digest: str) -> None:
    path = store_dir / digest
    if not path.is_file():
        conn.sendall(json.dumps({"sha": digest, "missing": True}).encode() + b"\n")
        return
    with open(path, "rb") as f:  # published contents are never removed while a run uses them
        info = os.fstat(f.fileno())
        header = {"sha": digest, "size": info.st_size, "mode": info.st_mode & 0o777}
        conn.sendall(json.dumps(header).encode() + b"\n")
        conn.sendfile(f)


# ---- fetching ---------------------------------------------------------------------------------


def fetch(
    store_dir: Path,
    blobs: list[tuple[str, int]],
    peers: list[tuple[str, int]],
    secret: bytes,
    wait: float,
) -> dict[str, Any]:
    """Asks each peer in turn for what is still missing; what none had is reported back."""
    sizes = dict(blobs)
    wanted = [d for d in store._absent(store_dir, sorted(sizes)) if d in sizes]
    fetched, received, errors = 0, 0, []
    for peer in peers:
        if not wanted:
            break
        got, size, error = _from_peer(store_dir, peer, wanted, sizes, secret, wait)
        fetched, received = fetched + len(got), received + size
        wanted = [d for d in wanted if d not in got]
        if error:
            errors.append(f"{peer[0]}:{peer[1]}: {error}")
    return {"fetched": fetched, "bytes": received, "missing": wanted, "errors": errors}


def _from_peer(
    store_dir: Path,
    peer: tuple[str, int],
    wanted: list[str],
    sizes: dict[str, int],
    secret: bytes,
    wait: float,
) -> tuple[set[str], int, str]:
    got: set[str] = set()
    received = 0
    try:
        conn = socket.create_connection(peer, timeout=wait)
    except OSError as exc:
        return got, 0, _why(exc)
    try:
        conn.settimeout(IO_TIMEOUT_S)
        reader = conn.makefile("rb")
        greeting = reader.readline(256).split()
        if len(greeting) != 2 or greeting[0] != GREETING:
            return got, 0, "not a tfdeploy peer"
        proof = _proof(secret, bytes.fromhex(greeting[1].decode()))
        conn.sendall(proof.encode() + b" " + json.dumps({"want": wanted}).encode() + b"\n")
        for digest in wanted:
            header = json.loads(reader.readline(4096).decode() or "null")
            if not isinstance(header, dict) or header.get("sha") != digest:
                return got, received, "the transfer ended early"
            if header.get("missing"):
                continue
            size, mode = int(header["size"]), int(header.get("mode", store.DEFAULT_MODE)) & 0o777
            if size != sizes[digest]:
                return got, received, f"offered {digest[:12]} with the wrong size"
            _receive_one(store_dir, reader, digest, size, mode)
            got.add(digest)
            received += size
    except (OSError, ValueError) as exc:
        return got, received, _why(exc)
    finally:
        conn.close()
    return got, received, ""


def _receive_one(store_dir: Path, reader: BinaryIO, digest: str, size: int, mode: int) -> None:
    """Streams one content into the store; it is published only if its sha256 matches."""

    def fill(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        hasher = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            left = size
            while left:
                chunk = reader.read(min(CHUNK, left))
                if not chunk:
                    raise ValueError("the transfer ended early")
                hasher.update(chunk)
                out.write(chunk)
                left -= len(chunk)
            os.fchmod(out.fileno(), mode)
        if hasher.hexdigest() != digest:
            raise ValueError(f"{digest[:12]} arrived damaged (sha256 mismatch): not stored")

    store._store(store_dir, digest, store_dir / digest, fill)


def _why(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
