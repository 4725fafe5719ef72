"""The local log archive: what `up` streams is kept here, by byte offset, bounded, and `logs`
reads it back when the hosts are gone (the lab's version: tests/integration/test_archive.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.results.archive import LogArchive, archive_ended, read_lines, run_dir
from deployer.results.runs import archived_lines
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import run_cli


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_bytes_land_at_their_offsets_and_repeats_change_nothing() -> None:
    archive = LogArchive("r-1")
    archive.write("worker:0", "h1", 0, b"one\ntw")
    archive.write("worker:0", "h1", 4, b"two\nthree")  # a re-read overlapping the last one
    archive.write("worker:0", "h1", 0, b"one\n")
    assert (run_dir("r-1") / "worker-0.log").read_bytes() == b"one\ntwo\nthree"
    assert list(read_lines("r-1")) == [("worker:0@h1", x) for x in ("one", "two", "three")]
    assert archive.size("worker:0") == 13 and not archive_ended("r-1")


def test_a_long_log_is_rotated_once_and_stays_bounded() -> None:
    archive = LogArchive("r-2", limit=100)
    offset = 0
    for i in range(60):
        line = f"line {i:03d}\n".encode()  # 9 bytes
        archive.write("worker:1", "h2", offset, line)
        offset += len(line)
    current = run_dir("r-2") / "worker-1.log"
    older = run_dir("r-2") / "worker-1.log.1"
    assert current.stat().st_size <= 100 and older.stat().st_size <= 100
    lines = [line for _, line in read_lines("r-2")]
    assert lines[-1] == "line 059" and len(lines) <= 200 // 9
    assert lines == [f"line {i:03d}" for i in range(60 - len(lines), 60)]  # contiguous
    assert LogArchive("r-2").size("worker:1") == offset  # the index survives a new process


def test_up_archives_every_line_and_logs_reads_it_without_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def finish() -> None:
        a.write("worker:0", "epoch 1\r\x1b[2Kepoch 1 done\n")
        b.write("worker:1", "héllo\nno newline")
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(3, finish)) == 0
    run_id = h.deployment.run_id
    assert archive_ended(run_id)
    assert archived_lines(run_id, None, None) == [
        ("worker:0@a", "epoch 1 done"),
        ("worker:1@b", "héllo"),
        ("worker:1@b", "no newline"),
    ]
    # The inventory's hosts (192.0.2.x) are never asked: the archive says the run ended.
    code, out, err = run_cli("logs", run_id, "--tail", "1")
    assert code == 0, err
    assert out.splitlines() == ["worker:0@a | epoch 1 done", "worker:1@b | no newline"]
    code, out, _ = run_cli("logs", run_id, "--task", "worker:1")
    assert out.splitlines() == ["worker:1@b | héllo", "worker:1@b | no newline"]
    code, _, err = run_cli("logs", run_id, "--task", "ps:0")
    assert code == 2 and "ps:0" in err


def test_sync_and_follow_do_not_go_together() -> None:
    code, _, err = run_cli("logs", "j-20261123T000000Z-abcd", "--sync", "-f")
    assert code == 2 and "does not follow" in err
