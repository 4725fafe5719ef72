"""The keeper's wire: one authenticated request and one authenticated reply per connection.

A run's keeper (keeper.py) speaks to each host's warden (warden.py) over the cluster network,
never through an SSH key copied to a host. Both hold the run's keeper secret, which came to each
of them in a request over SSH (never on a command line, never written down). Each connection:

    warden -> keeper: GREETING + nonce (32 random hex bytes) + "\\n"
    keeper -> warden: one JSON line {"request": {...}, "proof": HMAC(secret, ASK + nonce + request)}
    warden -> keeper: one JSON line {"reply": {...}, "proof": HMAC(secret, ANSWER + nonce + reply)}

The nonce is fresh per connection, so a recorded request replayed on another connection proves
nothing; the reply's proof binds it to the same nonce, so a host that is not of the run cannot
answer for one that is. Lines are bounded (MAX_LINE) before they are parsed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
from typing import Any

GREETING = b"TFDK1 "
ASK = b"tfdeploy-keeper-ask:"
ANSWER = b"tfdeploy-keeper-answer:"
MAX_LINE = 1024 * 1024  # a poll reply of a few hundred tasks
IO_TIMEOUT_S = 10.0


class WireError(Exception):
    """The other end broke the wire's rules (or went silent): nothing it said is believed."""


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def proof(secret: bytes, label: bytes, nonce: bytes, body: bytes) -> str:
    return hmac.new(secret, label + nonce + b"\n" + body, hashlib.sha256).hexdigest()


def new_nonce() -> bytes:
    return os.urandom(16).hex().encode()


def read_line(sock: socket.socket) -> bytes:
    """One line, at most MAX_LINE bytes, without its newline."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise WireError("the connection closed mid-line")
        data += chunk
        if len(data) > MAX_LINE + 1:
            raise WireError(f"a line over {MAX_LINE} bytes")
    return bytes(data[:-1])


def signed(secret: bytes, label: bytes, nonce: bytes, key: str, body: Any) -> bytes:
    raw = canonical(body)
    return canonical({key: body, "proof": proof(secret, label, nonce, raw)}) + b"\n"


def verified(secret: bytes, label: bytes, nonce: bytes, key: str, line: bytes) -> Any:
    """The body of a signed line, once its proof is the one `secret` makes for `nonce`."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        raise WireError("a line that is no JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("proof"), str) or key not in doc:
        raise WireError(f"a line without {key} and proof")
    expected = proof(secret, label, nonce, canonical(doc[key]))
    if not hmac.compare_digest(expected, doc["proof"]):
        raise WireError("a proof that the run's secret does not make")
    return doc[key]


def ask(address: str, port: int, secret: bytes, request: Any, timeout: float) -> Any:
    """One request to a warden; its verified reply. WireError or OSError when it cannot be had."""
    with socket.create_connection((address, port), timeout=min(timeout, IO_TIMEOUT_S)) as sock:
        sock.settimeout(timeout)
        hello = read_line(sock)
        if not hello.startswith(GREETING) or len(hello) != len(GREETING) + 32:
            raise WireError("no warden's greeting")
        nonce = hello[len(GREETING) :]
        sock.sendall(signed(secret, ASK, nonce, "request", request))
        return verified(secret, ANSWER, nonce, "reply", read_line(sock))
