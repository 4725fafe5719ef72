"""The request loop both real sessions share: send a request, read bytes until a reply line.

Transports differ only in how bytes move (an SSH channel, a local pipe); they subclass
`StreamSession` and provide `_send`, `_recv`, `_ended` and `close`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable

from deployer.core.errors import HostError
from deployer.hosts.transport import SessionEnded

WAIT_S = 0.5  # how often a waiting request re-checks its deadline and the connection
CHUNK = 256 * 1024


class StreamSession:
    """Send a request (a JSON line, maybe raw bytes after it), read one reply line, and maybe
    raw bytes after that (`read_raw`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()  # one request at a time; busy callers use a one-shot call
        self._buf = bytearray()

    def request(self, data: bytes, timeout: float | None, body: Iterable[bytes] = ()) -> bytes:
        """Sends `data`, then each piece of `body` as it comes (a file read piece by piece, so
        memory stays bounded), and returns the reply line."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._send(data)
            for piece in body:
                self._send(piece)
        except SessionEnded:
            line = self._last_words()  # it refused the body and said why before it left
            if line is None:
                raise
            return line
        return self._line(deadline, timeout)

    def send(self, data: bytes) -> None:
        """A request sent ahead of its turn: its reply comes after those of the requests
        before it (`reply`), as the host answers them in order."""
        self._send(data)

    def reply(self, timeout: float | None) -> bytes:
        """The next reply line, of the oldest request not yet answered here."""
        return self._line(None if timeout is None else time.monotonic() + timeout, timeout)

    def read_raw(self, size: int, sink: Callable[[bytes], None], timeout: float | None) -> None:
        """The `size` raw bytes that follow a reply line (remote/protocol.py RAW_BODY), handed to
        `sink` as they arrive; `timeout` bounds each wait for more, not the whole transfer."""
        left = size
        if self._buf:
            head = bytes(self._buf[:left])
            del self._buf[: len(head)]
            left -= len(head)
            sink(head)
        while left:
            deadline = None if timeout is None else time.monotonic() + timeout
            chunk = None
            while chunk is None:
                if deadline is not None and time.monotonic() >= deadline:
                    self.close()
                    raise HostError(self.name, f"the agent sent nothing for {timeout:g} s")
                chunk = self._recv(wait_s(deadline))
            if not chunk:
                raise self._ended()
            if len(chunk) > left:  # more than this body: the rest is the next reply's
                self._buf += chunk[left:]
                chunk = chunk[:left]
            left -= len(chunk)
            sink(chunk)

    def _line(self, deadline: float | None, timeout: float | None) -> bytes:
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

    def _last_words(self) -> bytes | None:
        """A reply line the command wrote before it stopped reading, if any."""
        with contextlib.suppress(HostError, SessionEnded):
            return self._line(time.monotonic() + 2.0, 2.0)
        return None

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
