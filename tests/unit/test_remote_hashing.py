"""remote/hashing.py: the sha256 a host takes of every content it stores or sends, on a thread
beside the bytes for large contents where the host has cores to spare. Inline or beside, the
hash is hashlib's; a stream that fails half-way leaves no thread behind (a serving agent lives
on)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from remote import hashing

MB = 1 << 20
REMOTE = Path(__file__).resolve().parents[2] / "remote"


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


def test_a_store_hashing_beside_keeps_a_whole_content_and_refuses_a_damaged_one(
    tmp_path: Path,
) -> None:
    """store.receive with the hash on its thread (as on a host with cores to spare, which this
    machine may not be): the content is published, a damaged one is not, and no part is left.
    In a process of its own, with the agent's directory on sys.path as on a host."""
    script = f"""
import hashlib, io, os, sys, threading
sys.path.insert(0, {str(REMOTE)!r})
import hashing, store
from pathlib import Path
hashing.SPARE_CORES = True
data = os.urandom(9 << 20)
digest = hashlib.sha256(data).hexdigest()
root = Path({str(tmp_path)!r})
pieces, beside = [], set()
def tee(piece):
    pieces.append(piece)
    beside.add(any(t.name == "sha256" for t in threading.enumerate()))
store.receive(root, [[digest, len(data)]], io.BytesIO(data), tee)
print(os.path.isfile(os.path.join(root, digest)), b"".join(pieces) == data, beside == {{True}})
os.unlink(os.path.join(root, digest))
damaged = data[:-1] + bytes([data[-1] ^ 1])
try:
    store.receive(root, [[digest, len(data)]], io.BytesIO(damaged))
except Exception as exc:
    print(type(exc).__name__, "damaged" in str(exc))
print(sorted(os.listdir(root)))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["True True True", "AgentError True", "[]"], done.stdout
