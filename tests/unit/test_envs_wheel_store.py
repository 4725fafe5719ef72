"""Resolutions share their wheels (issue 58): a set with one requirement added fetches only the
new wheel, every variant's wheels are one file on disk (the cache's wheel store), a stored wheel
damaged since is never reused, `prune --local` counts and frees the shared bytes once, and the
environment lines say what the cache holds and how to prune it.

Real pip against an index on loopback whose request log is the proof of what was fetched."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from deployer.api.prune_local import prune_local
from deployer.envs import wheelhouse
from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import cache_root, resolve
from deployer.envs.spec import from_lines
from deployer.up.environment import cache_line
from tests.support.wheels import IndexServer, make_wheel, pip_env, sha256, write_index

pytestmark = pytest.mark.slow

X86_311 = HostPlatform.of("3.11.2", "x86_64", "2.36")


@pytest.fixture
def server(tmp_path: Path) -> IndexServer:
    dists = tmp_path / "dists"
    make_wheel(dists, "big", "1.0", files={"big.bin": os.urandom(300_000)})
    make_wheel(dists, "tqdmish", "1.0")
    make_wheel(dists, "other", "1.0")
    return IndexServer(write_index(tmp_path / "index", dists).parent)


def _fetched(server: IndexServer) -> list[str]:
    return [p for p in server.requests if "/files/" in p]


def test_one_requirement_added_fetches_only_the_new_wheel_and_shares_the_rest(
    tmp_path: Path, server: IndexServer
) -> None:
    cache = tmp_path / "cache"
    with server.running():
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url, PIP_NO_CACHE_DIR="1")
        first = resolve(from_lines(["big==1.0"], base=tmp_path), X86_311, cache=cache, env=env)
        server.requests.clear()
        added = resolve(
            from_lines(["big==1.0", "tqdmish"], base=tmp_path), X86_311, cache=cache, env=env
        )
        fetched = _fetched(server)
    # Before: the whole set again (big's 300 kB fetched a second time).
    assert [p.rsplit("/", 1)[-1].split("#")[0] for p in fetched] == [
        "tqdmish-1.0-py3-none-any.whl"
    ], fetched
    assert {w.file for w in added.wheels} == {
        "big-1.0-py3-none-any.whl",
        "tqdmish-1.0-py3-none-any.whl",
    }
    # One file on disk for both entries and the store (before: a copy per entry).
    big = "big-1.0-py3-none-any.whl"
    one = (first.wheel_dir / big).stat()
    two = (added.wheel_dir / big).stat()
    assert (one.st_ino, one.st_dev) == (two.st_ino, two.st_dev) and one.st_nlink == 3
    digest = next(w.sha256 for w in added.wheels if w.file == big)
    assert digest == sha256(tmp_path / "dists" / big)
    assert os.path.samefile(wheelhouse.store_of(cache) / digest, added.wheel_dir / big)


def test_a_stored_wheel_damaged_since_is_fetched_again_not_reused(
    tmp_path: Path, server: IndexServer
) -> None:
    cache = tmp_path / "cache"
    with server.running():
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url, PIP_NO_CACHE_DIR="1")
        first = resolve(from_lines(["big==1.0"], base=tmp_path), X86_311, cache=cache, env=env)
        stored = first.wheel_dir / "big-1.0-py3-none-any.whl"
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes, in place: every link sees it
        stored.write_bytes(bytes(data))
        server.requests.clear()
        added = resolve(
            from_lines(["big==1.0", "other"], base=tmp_path), X86_311, cache=cache, env=env
        )
        fetched = _fetched(server)
    good = sha256(tmp_path / "dists" / "big-1.0-py3-none-any.whl")
    assert next(w.sha256 for w in added.wheels if w.name == "big") == good
    assert sha256(added.wheel_dir / "big-1.0-py3-none-any.whl") == good
    assert any("big-1.0" in p for p in fetched), fetched
    assert (wheelhouse.store_of(cache) / good).exists()


def test_prune_local_counts_shared_wheels_once_and_empties_the_store(
    tmp_path: Path, server: IndexServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    with server.running():
        env = pip_env(tmp_path, PIP_INDEX_URL=server.url, PIP_NO_CACHE_DIR="1")
        first = resolve(from_lines(["big==1.0"], base=tmp_path), X86_311, env=env)
        second = resolve(from_lines(["big==1.0", "other"], base=tmp_path), X86_311, env=env)
    line = cache_line()
    held, entries = wheelhouse.disk_use(cache_root())
    big = (first.wheel_dir / "big-1.0-py3-none-any.whl").stat().st_size
    assert entries == 2 and big < held < 2 * big  # the 300 kB wheel once, not twice
    assert "in 2 environments" in line and "`tfdeploy prune --local` frees" in line, line
    assert str(cache_root()) in line
    # Removing the first entry frees its own files only: big stays, linked by the second.
    past = time.time() - 3600
    for entry in (first.path, second.path):
        os.utime(entry / wheelhouse.MANIFEST, (past, past))
    dry = prune_local(keep=0, grace=0, dry_run=True)
    assert dry.bytes >= held - 4096 and dry.environments  # both go: everything, counted once
    assert dry.bytes <= held
    done = prune_local(keep=0, grace=0)
    assert done.bytes == dry.bytes
    assert not any(wheelhouse.store_of(cache_root()).iterdir())
    assert wheelhouse.disk_use(cache_root())[1] == 0
