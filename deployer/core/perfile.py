"""A parse of a local file kept per process, read again when the file changes."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerFile(Generic[T]):
    """What a file parses to, kept per process and read again when the file changes.

    A fleet's connections all read the same ssh_config and the same key files: parsed once
    per connection, an ssh_config of N hosts cost N² lines over a fleet of N, a key file a parse
    each; once is enough.
    """

    def __init__(self, parse: Callable[[str], T]) -> None:
        self._parse = parse
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int], T]] = {}

    def get(self, path: str) -> T:
        """The parse of `path` (raises OSError like open() when it is missing or unreadable)."""
        st = os.stat(path)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = self._parse(path)  # outside the lock: a slow parse never holds other files up
        with self._lock:
            self._cache[path] = (stamp, value)
        return value
