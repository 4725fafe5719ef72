"""paramiko's private internals, fenced: every use of them is in this module, and only with a
paramiko whose source they were written against.

paramiko has no public hook for four of tfdeploy's savings: the reader thread's poll interval
and DEBUG-message parsing (`Transport._active_check_timeout`, `Transport._parse_debug`), the
handshake timer (`Packetizer.start_handshake` and its two partners), the channel buffer
(`BufferedPipe`'s `_buffer`, `_buffer_frombytes`, `_cv`, `_event`, `_closed`, set as
`Channel.in_buffer`) and the way a Packetizer reads its socket (several exact-size `recv`s per
packet, `sock._closed`). A paramiko release may change any of them without notice, so they are
used only with the versions in `KNOWN_GOOD`, read line by line for it (3.4.0, 3.5.1, 4.0.0,
5.0.0, 5.1.0: the parts above are the same in all of them). Any other version, or
`TFDEPLOY_PARAMIKO=stock` in the environment, gets stock paramiko: the same connections,
slower (each class below says by how much), never wrong.

`PATH` says which path this process took ("tuned" or "stock") and `WHY`; both are logged once,
at DEBUG, when this module is imported. The environment is read once, then too.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from typing import Any

import paramiko
from paramiko.buffered_pipe import BufferedPipe, PipeTimeout

log = logging.getLogger(__name__)

# [lowest, first past the highest): the releases whose internals the classes below were checked
# against. Widen it only after reading the new release's modules `paramiko.packet`,
# `paramiko.transport` (Transport's __init__ and _parse_debug), `paramiko.buffered_pipe` and
# `paramiko.channel` (its use of in_buffer).
KNOWN_GOOD = ((3, 4), (5, 2))
ENV = "TFDEPLOY_PARAMIKO"  # "stock": stock paramiko whatever its version (tests, a suspected bug)
READ_AHEAD = 1024 * 1024  # bytes one socket read may bring (_ReadAhead)


def choose(version: str, env: Mapping[str, str]) -> tuple[str, str]:
    """("tuned" or "stock", why) for a paramiko `version` and an environment."""
    if env.get(ENV, "").strip().lower() == "stock":
        return "stock", f"{ENV}=stock"
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    low, high = KNOWN_GOOD
    if len(parts) < 2 or not low <= parts < high:
        span = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
        return "stock", f"paramiko {version} is outside the versions checked ({span})"
    return "tuned", f"paramiko {version}"


PATH, WHY = choose(paramiko.__version__, os.environ)
TUNED = PATH == "tuned"
log.debug("paramiko: %s path (%s)", PATH, WHY)


def new_transport(sock: socket.socket | paramiko.Channel, **options: Any) -> paramiko.Transport:
    """A client Transport over `sock` (`options`: Transport's own keyword arguments)."""
    if not TUNED:
        return paramiko.Transport(sock, **options)
    return _Transport(_ReadAhead(sock), packetizer_class=_Packetizer, **options)


def keep_pieces(chan: paramiko.Channel) -> None:
    """Makes a new channel keep what it receives as the packets' own bytes (`_PiecePipe`).
    Before its command starts: nothing has arrived yet. Stock: paramiko's buffer stays."""
    if TUNED:
        chan.in_buffer = _PiecePipe()


class _Transport(paramiko.Transport):  # type: ignore[misc]  # paramiko is untyped
    """paramiko's Transport, waking its reader thread once a second instead of ten times.

    The reader polls with a socket timeout only to notice close() and keepalive deadlines
    (both whole seconds here); close() shuts the socket and returns without waiting for it.
    At 0.1 s, 256 idle connections cost the controller ~2,500 wakeups a second: CPU that grew
    with hosts times wall time (a third of `down`'s at 256 lab hosts).
    """

    _active_check_timeout = 1.0

    def _parse_debug(self, m: paramiko.Message) -> None:
        # sshd sends two per login (the key's options); paramiko escapes each byte in Python
        # (~0.1 ms per login) only to log the text at DEBUG, which is normally off.
        if self.logger.isEnabledFor(logging.DEBUG):
            super()._parse_debug(m)


class _Packetizer(paramiko.Packetizer):  # type: ignore[misc]  # paramiko is untyped
    """paramiko's Packetizer with its handshake deadline kept as a time, not a thread.

    paramiko starts a `threading.Timer` per connection only to set a flag that the reader
    checks between socket timeouts; the thread cost ~0.14 ms of controller CPU per host, a
    few percent of a verb's. The deadline below is checked at the same points. (Our connect
    bounds the key exchange by its own wait too.)
    """

    _handshake_deadline: float | None = None

    def start_handshake(self, timeout: float) -> None:
        if self._handshake_deadline is None:
            self._handshake_deadline = time.monotonic() + float(timeout)

    def handshake_timed_out(self) -> bool:
        deadline = self._handshake_deadline
        return deadline is not None and time.monotonic() > deadline

    def complete_handshake(self) -> None:
        self._handshake_deadline = None


class _Pieces:
    """Received bytes nobody read yet, as they came: a queue of the packets' payloads."""

    def __init__(self) -> None:
        self.items: collections.deque[bytes] = collections.deque()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def append(self, data: bytes) -> None:
        self.items.append(data)
        self.size += len(data)

    def take(self, nbytes: int) -> bytes:
        """The oldest payload whole (no copy), or its first `nbytes`."""
        first = self.items[0]
        if len(first) > nbytes:
            self.items[0] = first[nbytes:]
            first = first[:nbytes]
        else:
            self.items.popleft()
        self.size -= len(first)
        return first

    def take_all(self) -> bytes:
        out = b"".join(self.items)
        self.items.clear()
        self.size = 0
        return out


class _PiecePipe(BufferedPipe):  # type: ignore[misc]  # paramiko is untyped
    """paramiko's channel buffer without its two copies of every byte.

    paramiko appends each packet's payload to an array and copies reads out of it again (a
    fresh bytes object each, and a move of the rest to the array's front); on a pull that was
    ~0.45 ms of controller CPU per MB, a fifth of it. Here a read returns the oldest payload
    itself (CHANNEL_PACKET at most, hosts/ssh.py). The locking, the event (`Channel.fileno`)
    and closing are paramiko's, unchanged: they only ask the buffer's length.
    """

    def __init__(self) -> None:
        super().__init__()
        self._buffer = _Pieces()

    def _buffer_frombytes(self, data: bytes) -> None:
        self._buffer.append(data)

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        with self._cv:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._buffer and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise PipeTimeout()
                self._cv.wait(left)
            if not self._buffer:
                return b""  # closed, all read
            out = self._buffer.take(nbytes)
            if not self._buffer and self._event is not None and not self._closed:
                self._event.clear()
            return out

    def empty(self) -> bytes:
        with self._cv:
            out = self._buffer.take_all()
            if self._event is not None and not self._closed:
                self._event.clear()
            return out


class _ReadAhead:
    """The connection's socket as paramiko reads it: one large read serves many of its small
    ones. paramiko reads every packet in two or more exact-size reads (the header, then the
    rest, appended as they come), each a syscall (and, with a timeout, a poll too); a 1 GB pull
    made ~100,000 of each. Right only while paramiko never polls the descriptor itself (bytes
    read ahead would wait unseen): true of the versions in KNOWN_GOOD."""

    def __init__(self, sock: socket.socket | paramiko.Channel) -> None:
        self.wrapped = sock
        self._data = b""
        self._at = 0

    def recv(self, size: int) -> bytes:
        if self._at >= len(self._data):
            self._data, self._at = self.wrapped.recv(READ_AHEAD), 0
        piece = self._data[self._at : self._at + size]
        self._at += len(piece)
        return piece

    def __getattr__(self, name: str) -> Any:  # send, settimeout, close, _closed, ...
        return getattr(self.wrapped, name)
