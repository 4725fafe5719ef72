"""The request loop both real sessions share: send a request, read bytes until a reply line.

Transports differ only in how bytes move (an SSH channel, a local pipe); they subclass
`StreamSession` and provide `_send`, `_recv`, `_ended` and `close`.
"""

from __future__ import annotations

import threading
import time

from deployer.core.errors import HostError
from deployer.hosts.transport import SessionEnded

WAIT_S = 0.5  # how often a waiting request re-checks its deadline and the connection
CHUNK = 256 * 1024


class StreamSession:
    """Send a request (a JSON line, maybe raw bytes after it), read one reply line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()  # one request at a time; busy callers use a one-shot call
        self._buf = bytearray()

    def request(self, data: bytes, timeout: float | None) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._send(data)
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if deadline is not None and time.monotonic() >= deadline:
                self.close()  # its state is unknown now: never reuse it
                raise HostError(self.name, f"the agent did not answer within {timeout:g} s")
            chunk = self._recv(wait_s(deadline))
            if chunk is None:
                continue
            if not chunk:
                raise self._ended()
            self._buf += chunk

    def _send(self, data: bytes) -> None:
        raise NotImplementedError

    def _recv(self, wait: float) -> bytes | None:
        """Bytes read, b"" at end of stream, None if nothing arrived within `wait` seconds."""
        raise NotImplementedError

    def _ended(self) -> SessionEnded:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def wait_s(deadline: float | None) -> float:
    """How long one wait may block: WAIT_S, or less when the deadline is nearer."""
    if deadline is None:
        return WAIT_S
    return max(0.0, min(WAIT_S, deadline - time.monotonic()))
