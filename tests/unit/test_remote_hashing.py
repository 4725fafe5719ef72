"""remote/hashing.py: the sha256 a host takes of every content it stores or sends, on a thread
beside the bytes for large contents where the host has cores to spare. Inline or beside, the
hash is hashlib's; a stream that fails half-way leaves no thread behind (a serving agent lives
on)."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from remote import hashing

MB = 1 << 20


def threads() -> int:
    return sum(t.name == "sha256" for t in threading.enumerate())


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("size", [0, 1000, hashing.BESIDE_FROM, 9 * MB + 7])
def test_the_hash_is_hashlibs_inline_or_beside(size: int, beside: bool) -> None:
    data = os.urandom(size)
    with hashing.Sha256(size, beside) as hasher:
        assert threads() == beside
        for start in range(0, size, MB):
            hasher.update(data[start : start + MB])
        assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert threads() == 0


def test_only_a_large_content_on_a_host_with_cores_to_spare_is_hashed_beside() -> None:
    with hashing.Sha256(hashing.BESIDE_FROM) as large, hashing.Sha256(MB) as small:
        assert threads() == (1 if hashing.SPARE_CORES else 0)
        large.update(b"x")
        small.update(b"x")
        assert large.hexdigest() == small.hexdigest() == hashlib.sha256(b"x").hexdigest()


def test_a_stream_that_fails_half_way_leaves_no_thread() -> None:
    with pytest.raises(OSError), hashing.Sha256(10 * MB, beside=True) as hasher:
        for _ in range(hashing.AHEAD + 2):  # more pieces than may wait: the thread is busy
            hasher.update(os.urandom(MB))
        raise OSError("the stream broke")
    assert threads() == 0
