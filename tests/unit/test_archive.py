"""The local log archive: what `up` streams is kept here, by byte offset, bounded, and `logs`
reads it back when the hosts are gone (the lab's version: tests/integration/test_archive.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deployer.core.lines import LineAssembler
from deployer.results.archive import (
    LogArchive,
    archive_ended,
    damaged,
    let_go,
    read_runs,
)
from deployer.results.runs import archived_runs
from deployer.results.runstore import run_dir
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import one_line, run_cli


def read_lines(run_id: str) -> list[tuple[str, str]]:
    return [(label, line) for label, lines in read_runs(run_id) for line in lines]


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


HOSTILE = (
    "A\x07B\x1b[2JC\x1b]52;c;ZWNobw==\x1b\\D\x1bP1$qm\x1b\\E\u009b31mF\u009d0;T\u009cG\x00\x0e"
    "\x7fH\u202eevil\u202cI\u2066J\u2069K\u200eL\u200fM\u061cN\u200bO\u200cP\u200dQ\u2060R"
    "\ufeffS\u2028T\u2029U\x1b]0;t\x07V \u00e9\u2013\u00b0 50%\r100%\n"
)


def test_the_archive_holds_nothing_a_terminal_obeys_and_logs_reads_it_as_live() -> None:
    """Issue 47: the archive is a file a person may `cat`; it held a task's escape sequences,
    C1 controls and bidi overrides as written. Now every one is replaced byte for byte (offsets
    stay the host log's), whatever the chunking, and `logs` shows what `up` showed live."""
    data = (HOSTILE * 3).encode()
    live = LineAssembler().feed(data)
    for step in (1, 2, 3, 5, 7, 64):
        run_id = f"r-h{step}"
        archive = LogArchive(run_id)
        for at in range(0, len(data), step):
            archive.write("worker:0", "h1", at, data[at : at + step])
        kept = (run_dir(run_id) / "worker-0.log").read_bytes()
        assert len(kept) == len(data) == archive.size("worker:0")
        assert not re.search(rb"[\x01-\x07\x0b\x0c\x0e-\x1f]|\xc2[\x80-\x9f]", kept), step
        shown = kept.decode()
        assert not any(
            ch in shown for ch in "\u202a\u202e\u2066\u2069\u200b\u200e\u061c\u2028\ufeff"
        )
        assert "\u00e9\u2013\u00b0" in shown  # what is printable stays as it was
        assert [line for _, line in read_lines(run_id)] == live, step


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


def test_a_rotated_archive_starts_with_a_whole_line_and_logs_says_what_it_let_go() -> None:
    """Polls end mid-line. A file rotated there, two rotations later, was the oldest kept, and
    it began with the tail of a line whose start was gone: printed as a line, without a word."""
    log = b"".join(f"line {i:03d} of the task\n".encode() for i in range(200))
    archive = LogArchive("r-6", limit=300)
    for offset in range(0, len(log), 37):  # cuts that fall mid-line
        archive.write("worker:0", "h1", offset, log[offset : offset + 37])
    archive.end()
    lines = [line for _, line in read_lines("r-6")]
    first = int(lines[0].split()[1])
    assert first > 0 and lines == [f"line {i:03d} of the task" for i in range(first, 200)]
    gone = log.index(f"line {first:03d}".encode())
    assert let_go("r-6") == {"worker:0": gone}
    code, out, err = run_cli("logs", "r-6")
    assert code == 0 and out.splitlines()[0] == f"worker:0@h1 | line {first:03d} of the task"
    assert "worker:0: the local archive keeps" in one_line(err), err
    assert f"the first {gone} bytes of its log are not here" in one_line(err), err


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
    assert [(label, x) for label, lines in archived_runs(run_id, None, None) for x in lines] == [
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


def test_a_file_removed_while_up_writes_is_never_padded_with_nul_bytes() -> None:
    """Issue 28 item 5: a worker-1.log deleted while `up` ran came back starting with NUL
    bytes (a write at the next offset of a new, empty file), and nothing said so."""
    archive = LogArchive("r-3")
    archive.write("worker:1", "h2", 0, b"one\ntwo\n")
    path = run_dir("r-3") / "worker-1.log"
    path.unlink()
    archive.write("worker:1", "h2", 8, b"three\n")
    assert path.read_bytes() == b"three\n"
    assert archive.size("worker:1") == 14  # what comes next still lands at its offset
    archive.write("worker:1", "h2", 14, b"four\n")
    assert path.read_bytes() == b"three\nfour\n"
    lost = "its first 8 bytes were lost here (worker-1.log was removed)"
    assert damaged("r-3") == {"worker:1": lost}
    assert damaged("r-3", "worker:1") == {"worker:1": lost}
    archive.reset("worker:1")  # what `logs --sync` does before fetching it whole
    assert not path.exists() and archive.size("worker:1") == 0 and not damaged("r-3")


def test_a_finished_runs_file_removed_or_cut_short_is_damage() -> None:
    archive = LogArchive("r-4")
    archive.write("worker:0", "h1", 0, b"a\nb\n")
    archive.write("worker:1", "h2", 0, b"c\nd\n")
    archive.end()
    (run_dir("r-4") / "worker-0.log").unlink()
    with (run_dir("r-4") / "worker-1.log").open("r+b") as f:
        f.truncate(2)
    assert damaged("r-4") == {
        "worker:0": "its file worker-0.log is missing",
        "worker:1": "worker-1.log was cut short (2 of 4 bytes)",
    }
    assert damaged("r-4", "ps:0") == {}


def test_a_finished_run_with_a_deleted_log_says_so_and_asks_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28 item 5: `logs RUN` dropped the deleted task without a word; `--task` named it
    missing on every host (which were never asked)."""
    h = Harness(tmp_path, TWO_WORKERS, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def finish() -> None:
        a.write("worker:0", "zero\n")
        b.write("worker:1", "one\n")
        a.exit("worker:0")
        b.exit("worker:1")

    assert h.run(h.at(3, finish)) == 0
    run_id = h.deployment.run_id
    (run_dir(run_id) / "worker-0.log").unlink()
    # The hosts (192.0.2.x) cannot be reached from here: what is missing is said, and the
    # rest of the archive shown.
    code, out, err = run_cli("logs", run_id)
    flat = " ".join(err.split())
    assert f"local archive of run {run_id}, worker:0: its file worker-0.log is missing" in flat
    assert "reading the run's hosts instead" in flat
    assert "from the local archive instead" in flat
    assert (code, out.splitlines()) == (0, ["worker:1@b | one"])


def test_a_tail_too_large_for_any_log_shows_all_of_it() -> None:
    """Issue 28 item 5: `--tail 99999999999999999999999` ended in `internal error:
    OverflowError`."""
    archive = LogArchive("r-5")
    archive.write("worker:0", "h1", 0, b"a\nb\n")
    archive.end()
    code, out, err = run_cli("logs", "r-5", "--tail", "99999999999999999999999")
    assert (code, out.splitlines(), err) == (0, ["worker:0@h1 | a", "worker:0@h1 | b"], "")
    assert run_cli("logs", "r-5", "--tail", "9" * 5000)[0] == 2  # int() refuses 4300+ digits


def test_sync_and_follow_do_not_go_together() -> None:
    code, _, err = run_cli("logs", "j-20261123T000000Z-abcd", "--sync", "-f")
    assert code == 2 and "does not follow" in err
