"""The code directory's hash cache: unchanged files are not read again, and no change is missed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from deployer.push import sync
from deployer.push.hashcache import RACY_S, HashCache

OLD = time.time() - 3600  # an mtime well before any scan: not "racy"


def _tree(root: Path, files: dict[str, bytes], mtime: float = OLD) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (mtime, mtime))


def _settle() -> None:
    """Lets the files' ctime age past RACY_S: only then does a scan remember their hashes."""
    time.sleep(RACY_S + 0.1)


def _hashes(root: Path) -> dict[str, str]:
    return {f.path: f.sha256 for f in sync.scan(root).files}


def _remembered(root: Path) -> dict[str, Any]:
    """What a scan of root leaves in the cache for the next one."""
    sync.scan(root)
    files: dict[str, Any] = json.loads(HashCache(root).path.read_text())["files"]
    return files


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files scan hashes by reading them (the real hashing, counted)."""
    read: list[str] = []
    real = hashlib.file_digest

    def counted(f: Any, digest: str) -> Any:
        read.append(os.path.basename(f.name))
        return real(f, digest)

    monkeypatch.setattr(sync.hashlib, "file_digest", counted)
    return read


def test_a_second_scan_reads_no_unchanged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path / "code", {"a.py": b"print(1)\n", "data/big.bin": os.urandom(50_000)})
    _settle()
    first = _hashes(tmp_path / "code")
    read = _reads(monkeypatch)
    assert _hashes(tmp_path / "code") == first
    assert read == []


def test_a_rewrite_with_the_same_size_and_mtime_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting mtime back (as `cp -p`, `touch -r` or an editor may) cannot hide a change: the
    write moved ctime, which no user can set."""
    code = tmp_path / "code"
    _tree(code, {"train.py": b"lr = 0.1\n"})
    _settle()
    assert set(_remembered(code)) == {"train.py"}
    _tree(code, {"train.py": b"lr = 0.2\n"})  # same size, same mtime
    read = _reads(monkeypatch)
    assert _hashes(code) == {"train.py": hashlib.sha256(b"lr = 0.2\n").hexdigest()}
    assert read == ["train.py"]


def test_a_file_changed_just_before_its_hashing_is_not_remembered(tmp_path: Path) -> None:
    """Its mtime set back or not: a write in the same clock tick could keep its stamps."""
    code = tmp_path / "code"
    _tree(code, {"old.py": b"1\n"})
    _settle()
    _tree(code, {"fresh.py": b"2\n"})  # mtime an hour ago, ctime now
    assert set(_remembered(code)) == {"old.py"}
    assert RACY_S >= 2  # FAT's mtime ticks are 2 s


def test_deleted_files_leave_the_cache_and_a_damaged_cache_costs_only_the_hashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "code"
    _tree(code, {"a.py": b"a\n", "b.py": b"b\n"})
    _settle()
    assert set(_remembered(code)) == {"a.py", "b.py"}
    (code / "b.py").unlink()
    assert set(_remembered(code)) == {"a.py"}
    HashCache(code).path.write_text("{not json")
    read = _reads(monkeypatch)
    assert _hashes(code) == {"a.py": hashlib.sha256(b"a\n").hexdigest()}
    assert read == ["a.py"]


def test_the_cache_is_kept_per_code_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two code directories with the same relative names never share entries."""
    _tree(tmp_path / "one", {"m.py": b"one\n"})
    _tree(tmp_path / "two", {"m.py": b"two\n"})
    assert _hashes(tmp_path / "one") != _hashes(tmp_path / "two")
    assert HashCache(tmp_path / "one").path != HashCache(tmp_path / "two").path


def test_the_state_folder_inside_the_code_directory_is_not_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code directory holding the state folder (code = "~"; a test's tmp dir): the cache the
    scan writes at its end must not be a file of the next push, where it would have changed."""
    code = tmp_path / "code"
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(code / "nested" / "state"))
    _tree(code, {"train.py": b"x\n", "nested/notes.txt": b"kept\n"})
    first = _hashes(code)
    second = _hashes(code)  # the cache now exists inside the tree
    assert first == second
    assert set(second) == {"train.py", "nested/notes.txt"}
    assert HashCache(code).path.is_file()
