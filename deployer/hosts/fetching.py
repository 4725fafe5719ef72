"""The bulk fetch's orders and its reader: each file's raw bytes to its sink, a hashed fetch's
trailer (the whole file's sha256, and whether it stood still) kept apart (Agent.fetch_each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from remote import protocol


@dataclass(frozen=True)
class Fetched:
    """What a fetch brought: the content bytes, and for a hashed fetch what the host said."""

    count: int
    sha256: str | None = None  # the whole file's, as the host read it
    steady: bool = True  # the file stood still while the host read it


FETCH_AHEAD = 4  # fetch requests a host holds before their turn (fetch_each)


@dataclass(frozen=True)
class FetchOrder:
    """One file to fetch: where its bytes go, from which offset, and (hashed) its listed size."""

    task: str
    path: str
    offset: int
    sink: Callable[[bytes | memoryview], None]
    listed_size: int | None = None  # set: the host hashes the whole file and says if it stood

    def params(self, run_id: str, patterns: Sequence[str]) -> protocol.FetchRequest:
        return {
            "run_id": run_id,
            "task": self.task,
            "path": self.path,
            "patterns": list(patterns),
            "offset": self.offset,
            "hash": self.listed_size is not None,
        }


class FetchReading:
    """One fetch's reply being read: the content to the order's sink, the trailer kept."""

    def __init__(self, order: FetchOrder) -> None:
        self.order = order
        self.trailer = bytearray()
        self.content = max(0, (order.listed_size or 0) - order.offset)
        hashed = order.listed_size is not None
        self.sink = Trailing(order.sink, self.content, self.trailer) if hashed else order.sink

    def fetched(self, reply: protocol.FetchReply) -> Fetched:
        if self.order.listed_size is None:
            return Fetched(reply["raw"])
        count = reply["raw"] - protocol.FETCH_TRAILER
        said = bytes(self.trailer).decode("ascii", "replace")
        if count != self.content or len(said) != protocol.FETCH_TRAILER:  # its size changed
            return Fetched(min(count, self.content), sha256=None, steady=False)
        return Fetched(count, sha256=said[:64], steady=said[64:] == "1")


class Trailing:
    """A sink for a hashed fetch: the first `content` bytes go on to `sink`, the rest (the
    protocol.FETCH_TRAILER) into `trailer`."""

    def __init__(
        self, sink: Callable[[bytes | memoryview], None], content: int, trailer: bytearray
    ) -> None:
        self.sink, self.left, self.trailer = sink, content, trailer

    def __call__(self, data: bytes) -> None:
        take = min(self.left, len(data))
        if take:
            self.sink(memoryview(data)[:take] if take < len(data) else data)
            self.left -= take
        room = protocol.FETCH_TRAILER + 1 - len(self.trailer)  # one more tells it overflowed
        if room > 0 and take < len(data):
            self.trailer += data[take : take + room]  # a file grown by gigabytes: not kept
