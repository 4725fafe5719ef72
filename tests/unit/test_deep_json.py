"""A JSON text nested 2,000 deep, where the controller reads what it did not just write: a run
record on disk, an agent's reply line, the code's hash cache. Python's decoder raises
RecursionError there, which no `except ValueError` catches: each reader turns it into its own
error (or a fresh start), never an internal error (issue 58)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.core.errors import HostError
from deployer.hosts.channel import Channel
from deployer.hosts.local_transport import LocalTransport
from deployer.push import hashcache
from deployer.results import state

DEEP = "[" * 2000 + "]" * 2000


def test_a_deep_run_record_is_an_unreadable_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path))
    run_id = "job-20261201T000000Z-abcd"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{run_id}.json").write_text(DEEP)
    with pytest.raises(state.UnreadableRecord, match="nested deeper"):
        state.load(run_id)


@pytest.mark.parametrize("line", [DEEP, "[1, 2]", '"ok"'])
def test_an_agent_reply_that_is_deep_or_no_object_is_a_host_error(line: str) -> None:
    channel = Channel(LocalTransport("h1"), python="python3", workdir="~/.tfdeploy")
    with pytest.raises(HostError, match="h1: the tfdeploy agent"):
        channel._reply(0, line.encode(), b"")


def test_a_deep_hash_cache_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    path.write_text(DEEP)
    assert hashcache._load(path, str(tmp_path)) == {}
