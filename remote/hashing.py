"""sha256 of a stream, taken beside it: the bytes move on while their hash is computed.

Every content that crosses a host is hashed there (a store checks what it receives, a fetch
hashes what it sends). In one thread that hash is on the bytes' path: a relay receives, hashes,
writes and forwards each piece in turn, and hashing is about half of that. hashlib lets go of
the GIL while it hashes, so on a thread of its own it runs on another core while the next piece
is read and written (docs/bench/hashing.md: one hop, inline against beside).

Only where that core is there: with fewer, sshd, the agent and the kernel's copies already use
them during a transfer, and the thread only adds switches (the lab's 4-host push, 5 processes
on 2 shared cores, was slower with it). Small contents are hashed inline too: starting a thread
costs more than it saves below a few MB, and code is mostly small files.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading

BESIDE_FROM = 4 << 20  # contents this large or larger are hashed on a thread...
SPARE_CORES_FROM = 4  # ... on a host with this many cores or more for this process
AHEAD = 4  # pieces waiting for the hash at most: memory stays bounded (pieces of 1 MB)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # a container's or taskset's share, not the machine's
    except (AttributeError, OSError):
        return os.cpu_count() or 1


SPARE_CORES = _cores() >= SPARE_CORES_FROM


class Sha256:
    """hashlib.sha256's update/hexdigest; on a thread (`beside`) by default for a content of
    `size` >= BESIDE_FROM on a host with spare cores. Pieces given to `update` must not change
    afterwards (bytes, not a reused buffer). Use it as a context manager: leaving early (an
    error mid-stream) ends the thread."""

    def __init__(self, size: int, beside: bool | None = None) -> None:
        self._digest = hashlib.sha256()
        self._pieces: queue.Queue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if beside is None:
            beside = SPARE_CORES and size >= BESIDE_FROM
        if beside:
            self._pieces = queue.Queue(AHEAD)
            self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
            self._thread.start()

    def __enter__(self) -> Sha256:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def update(self, piece: bytes) -> None:
        if self._pieces is None:
            self._digest.update(piece)
        else:
            self._pieces.put(piece)

    def hexdigest(self) -> str:
        self._stop()
        return self._digest.hexdigest()

    def _run(self) -> None:
        assert self._pieces is not None
        while True:
            piece = self._pieces.get()
            if piece is None:
                return
            self._digest.update(piece)

    def _stop(self) -> None:
        """Every piece given is hashed once this returns."""
        if self._thread is not None and self._pieces is not None:
            self._pieces.put(None)
            self._thread.join()
            self._thread = None
