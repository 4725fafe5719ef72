"""`tfdeploy pull` and job.artifacts on scripted hosts: only missing contents travel, once per
content, interrupted pulls resume, nothing lands outside the destination, and artifacts come
home however `up` ends. Under faults (issue #28): Ctrl-C during `up`'s pull, two pulls into one
folder, private files, problems of this machine's disk, a pull that matched nothing. The host
side (globs, symlinks, `..`) runs for real in tests/unit/test_pull_host.py and
tests/integration/test_results.py."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deployer.cli.main import _raise_terminated
from deployer.core.errors import (
    ExitStatus,
    HostsFailed,
    Interrupted,
    JobFailed,
    TfdeployError,
)
from deployer.hosts.fetching import FETCH_AHEAD
from deployer.hosts.fleet import Fleet
from deployer.results.pull import PullResult, pull
from tests.support.fakehost import FakeClock, FakeFleetHosts
from tests.support.harness import TWO_WORKERS, Harness
from tests.support.helpers import plan

CKPT = b"\x01" * 5_000_000  # the same checkpoint on both workers (replicas agree)


def fleet_of(tmp_path: Path, clock: FakeClock | None = None) -> tuple[FakeFleetHosts, Fleet]:
    hosts = FakeFleetHosts(clock or FakeClock())
    hosts["a"].files = {"worker:0": {"ckpt/model.bin": CKPT, "log.json": b'{"loss": 1}'}}
    hosts["b"].files = {"worker:1": {"ckpt/model.bin": CKPT, "log.json": b'{"loss": 2}'}}
    return hosts, Fleet(plan(tmp_path, TWO_WORKERS).hosts, connect=hosts.connect)


def test_a_pull_brings_each_content_once_and_a_second_pull_nothing(tmp_path: Path) -> None:
    _, fleet = fleet_of(tmp_path)
    with fleet:
        first = pull(fleet, "r-1", ["ckpt/*", "*.json"], tmp_path / "out")
        again = pull(fleet, "r-1", ["ckpt/*", "*.json"], tmp_path / "out")
    base = tmp_path / "out" / "r-1"
    assert (base / "worker-0" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert (base / "worker-1" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert (base / "worker-1" / "log.json").read_bytes() == b'{"loss": 2}'
    assert (first.files, first.fetched_files) == (4, 3)  # the checkpoint travelled once
    assert first.fetched_bytes == len(CKPT) + 11 + 11
    assert (again.fetched_files, again.fetched_bytes) == (0, 0)
    assert "0 bytes sent, every file was already here" in again.summary()
    assert not list(base.rglob("*.part"))


def test_a_copy_is_made_without_copy_file_range_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas' second copy is made in the kernel (copy_file_range); a file system or kernel
    without it (ENOSYS, EXDEV: not something this machine has) falls back to reading here."""

    def unsupported(*_: object) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    _, fleet = fleet_of(tmp_path)
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out")
    assert result.fetched_files == 1
    for task in ("worker-0", "worker-1"):
        assert (tmp_path / "out" / "r-1" / task / "ckpt" / "model.bin").read_bytes() == CKPT


def test_replicas_content_is_shared_out_among_the_hosts_that_have_it(tmp_path: Path) -> None:
    """Contents both hosts have travel once each, and not all from one host: each host sends a
    part at once (over a real network, each over its own link). A content only one host has
    comes from it."""
    hosts, fleet = fleet_of(tmp_path)
    other = b"\x02" * len(CKPT)  # a second checkpoint shard of the same size, on both
    for host, task in (("a", "worker:0"), ("b", "worker:1")):
        hosts[host].files[task]["ckpt/shard.bin"] = other
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*", "*.json"], tmp_path / "out")
    fetched = {h: sorted(f["path"] for f in hosts[h].ops("fetch")) for h in ("a", "b")}
    assert fetched == {
        "a": ["ckpt/model.bin", "log.json"],
        "b": ["ckpt/shard.bin", "log.json"],
    }, fetched
    assert result.fetched_bytes == 2 * len(CKPT) + 11 + 11
    for task in ("worker-0", "worker-1"):
        shards = tmp_path / "out" / "r-1" / task / "ckpt"
        assert (shards / "model.bin").read_bytes() == CKPT
        assert (shards / "shard.bin").read_bytes() == other


def test_a_replica_that_only_looked_alike_is_fetched_from_its_own_host(tmp_path: Path) -> None:
    """Same path, same size, other bytes: the hosts' hashes (taken while the first copy
    travelled) tell the copies apart, and the other one comes from its own host."""
    hosts, fleet = fleet_of(tmp_path)
    diverged = b"\x03" * len(CKPT)
    hosts["b"].files["worker:1"]["ckpt/model.bin"] = diverged
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out")
    base = tmp_path / "out" / "r-1"
    assert (base / "worker-0" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert (base / "worker-1" / "ckpt" / "model.bin").read_bytes() == diverged
    assert [f["path"] for f in hosts["a"].ops("fetch")] == ["ckpt/model.bin"]
    assert [f["path"] for f in hosts["b"].ops("fetch")] == ["ckpt/model.bin"]
    assert (result.fetched_files, result.fetched_bytes) == (2, 2 * len(CKPT))
    # b listed twice: first unhashed, then its copy hashed while a's content travelled.
    assert [c.get("hash") for c in hosts["b"].ops("collect")] == [False, True]
    assert not list(base.rglob("*.part"))


def test_a_first_pull_does_not_say_anything_was_already_here(tmp_path: Path) -> None:
    _, fleet = fleet_of(tmp_path)
    with fleet:
        first = pull(fleet, "r-1", ["*.json"], tmp_path / "out")
    assert (
        first.summary()
        == f"pulled 2 files into {tmp_path / 'out' / 'r-1'}: 22 bytes sent (2 files)"
    )


def test_a_first_pull_lists_unhashed_and_the_hosts_hash_as_they_send(tmp_path: Path) -> None:
    """Issue #25: into an empty folder the hosts read each file once (hashing it on the way)
    instead of hashing everything first; replicas (same path and size on two tasks) are
    hashed first so their content travels once; a second pull compares hashes."""
    hosts, fleet = fleet_of(tmp_path)
    hosts["b"].files["worker:1"]["log.json"] = b'{"loss": 0.5}'  # not the size of a's
    with fleet:
        pull(fleet, "r-1", ["*.json"], tmp_path / "out")
        pull(fleet, "r-1", ["ckpt/*"], tmp_path / "fresh")
    a, b = hosts["a"], hosts["b"]
    # The checkpoint's content comes from a, which hashes it as it sends; only b's copy is
    # hashed in a listing, to be compared with what a sent.
    assert [c.get("hash") for c in a.ops("collect")] == [False, False]
    assert [(c.get("hash"), c.get("hash_only")) for c in b.ops("collect")] == [
        (False, None),
        (False, None),
        (True, {"worker:1": ["ckpt/model.bin"]}),
    ]
    json_fetch, ckpt_fetch = a.ops("fetch")
    assert json_fetch["hash"] and ckpt_fetch["hash"]  # every fetch: the host's hash as it sent
    assert (tmp_path / "out" / "r-1" / "worker-0" / "log.json").read_bytes() == b'{"loss": 1}'


def test_a_replica_rewritten_before_it_was_sent_leaves_each_task_its_own_content(
    tmp_path: Path,
) -> None:
    """The host that sends a group's content hashes it as it sends (never in a listing
    before): rewritten after the listing, it sends the new bytes with their hash. The other
    host's copy, hashed while they travelled, no longer matches and comes from its own host."""
    hosts, fleet = fleet_of(tmp_path)
    rewritten = b"\x04" * len(CKPT)

    def send_rewritten(data: bytes, sink: Callable[[bytes], None], _: threading.Event) -> None:
        sink(rewritten + hashlib.sha256(rewritten).hexdigest().encode() + b"1")

    hosts["a"].deliver = send_rewritten
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out")
    base = tmp_path / "out" / "r-1"
    assert (base / "worker-0" / "ckpt" / "model.bin").read_bytes() == rewritten
    assert (base / "worker-1" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert (result.fetched_files, result.fetched_bytes) == (2, 2 * len(CKPT))


def test_a_file_that_did_not_stand_still_while_sent_is_not_kept(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    hosts["a"].files = {"worker:0": {"log.json": b'{"loss": 1}'}}
    hosts["b"].files = {"worker:1": {}}

    def moved(data: bytes, sink: Callable[[bytes], None], closed: threading.Event) -> None:
        sink(data[:-1] + b"0")  # the host's trailer: the file changed while it was read

    hosts["a"].deliver = moved
    with fleet:
        result = pull(fleet, "r-1", ["*.json"], tmp_path / "out")
    [refusal] = result.refused
    assert refusal.startswith("worker:0@a: log.json: changed while it was pulled"), refusal
    assert (result.files, result.not_kept) == (0, 1)
    assert not list((tmp_path / "out").rglob("log.json")) and not list(tmp_path.rglob("*.part"))


def test_an_interrupted_pull_resumes_where_it_stopped(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    dest = tmp_path / "out" / "r-1" / "worker-0" / "ckpt" / "model.bin"
    dest.parent.mkdir(parents=True)
    sha = hashlib.sha256(CKPT).hexdigest()
    part = tmp_path / "out" / "r-1" / ".partial" / f"{sha}.part"
    part.parent.mkdir()
    part.write_bytes(CKPT[:3_000_000])  # what an earlier pull got before Ctrl-C
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out", tasks=["worker:0"])
    offsets = [r["offset"] for h in hosts.hosts.values() for r in h.ops("fetch")]
    assert offsets == [3_000_000]  # only the rest was asked for
    assert dest.read_bytes() == CKPT and not part.exists()
    assert (result.fetched_files, result.fetched_bytes) == (1, len(CKPT) - 3_000_000)


def test_a_host_path_cannot_land_outside_the_destination(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    hosts["a"].files["worker:0"]["../../escaped"] = b"x"
    with fleet, pytest.raises(HostsFailed) as info:  # refused where the reply is parsed
        pull(fleet, "r-1", ["*"], tmp_path / "out")
    assert (
        "collect reply is not valid: worker:0's file '../../escaped' has an empty, '.' or '..'"
        in (info.value.message)
    )
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out" / "escaped").exists()


@pytest.mark.parametrize("ending", ["success", "failure", "ctrl-c"])
def test_artifacts_come_home_however_up_ends(
    ending: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    to = tmp_path / "results"
    text = TWO_WORKERS.replace("[job]\n", f'[job]\nartifacts = ["ckpt/*"]\nartifacts_to = "{to}"\n')
    h = Harness(tmp_path, text, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]

    def end() -> None:
        a.files = {"worker:0": {"ckpt/model.bin": CKPT}}
        b.files = {"worker:1": {"ckpt/model.bin": CKPT}}
        if ending == "ctrl-c":
            raise KeyboardInterrupt
        a.exit("worker:0")
        b.exit("worker:1", 0 if ending == "success" else 1)

    if ending == "success":
        assert h.run(h.at(3, end)) == 0
    else:
        with pytest.raises(Interrupted if ending == "ctrl-c" else JobFailed):
            h.run(h.at(3, end))
    base = to / h.deployment.run_id
    assert (base / "worker-1" / "ckpt" / "model.bin").read_bytes() == CKPT
    summary = [s for s in h.view.steps if s.startswith("artifacts: pulled 2 files")]
    assert summary, h.view.steps
    # the pull came after every task was stopped
    for host in (a, b):
        names = [r["op"] for r in host.requests]
        assert names.index("collect") > max(i for i, n in enumerate(names) if n == "stop")


@pytest.mark.parametrize(
    ("board", "key", "expected"),
    [
        ('logdir = "tb"\ntask = "worker:5"', "job.tensorboard.task", "no task worker:5"),
        ('logdir = "tb"\nport = 2222', "job.tensorboard.port", "a TF port on a"),
        ('logdir = "tb"\ntask = "boss"', "job.tensorboard.task", "such as chief:0"),
        ("port = 6006", "job.tensorboard.logdir", "is missing"),
    ],
)
def test_tensorboard_settings_are_checked(
    tmp_path: Path, board: str, key: str, expected: str
) -> None:
    from deployer.core.errors import InventoryError

    with pytest.raises(InventoryError) as info:
        plan(tmp_path, TWO_WORKERS + f"\n[job.tensorboard]\n{board}\n")
    assert info.value.key == key and expected in info.value.expected, info.value.message


def test_a_tensorboard_sidecar_runs_beside_the_first_worker_on_its_loopback(
    tmp_path: Path,
) -> None:
    p = plan(tmp_path, TWO_WORKERS + '\n[job.tensorboard]\nlogdir = "logs dir"\n')
    board = p.task("tensorboard:0")
    assert (board.host, board.port, board.awaited) == ("a", 6006, False)
    assert "--logdir 'logs dir' --port 6006 --host 127.0.0.1" in board.command
    assert "tensorboard" not in p.cluster


def the_error(fn: Callable[[], object]) -> TfdeployError:
    with pytest.raises(TfdeployError) as info:
        fn()
    return info.value


# ---- issue #28 --------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_ups_artifacts_pull_keeps_what_arrived_and_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    """The pull is stopped, not started again beside itself (which deleted every `.part`);
    what arrived stays; the line says which pull fetches the rest, and that pull does."""
    old = signal.signal(signal.SIGTERM, _raise_terminated)  # what `tfdeploy` installs
    to = tmp_path / "results"
    text = TWO_WORKERS.replace("[job]\n", f'[job]\nartifacts = ["ckpt/*"]\nartifacts_to = "{to}"\n')
    h = Harness(tmp_path, text, monkeypatch)
    a, b = h.hosts["a"], h.hosts["b"]
    a.files = {"worker:0": {"ckpt/model.bin": CKPT}}
    b.files = {"worker:1": {}}

    def signal_mid_file(
        data: bytes, sink: Callable[[bytes], None], closed: threading.Event
    ) -> None:
        sink(data[:2_000_000])
        os.kill(os.getpid(), signum)  # as the terminal's Ctrl-C, or `timeout`'s SIGTERM
        closed.wait(30)  # the rest never comes: the connection stalls until it is closed

    a.deliver = signal_mid_file

    def end() -> None:
        a.exit("worker:0")
        b.exit("worker:1")

    try:
        with pytest.raises(Interrupted) as info:
            h.run(h.at(3, end))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert info.value.exit_status == 128 + signum
    run_id = h.deployment.run_id
    assert [len(host.ops("collect")) for host in (a, b)] == [1, 1]  # one pull, never two
    [part] = (to / run_id / ".partial").glob("*.part")
    assert part.stat().st_size == 2_000_000
    said = [s for s in h.view.steps if s.startswith("artifacts pull interrupted")]
    assert said == [
        "artifacts pull interrupted: what arrived is kept, and the same pull again fetches only "
        f"the rest: tfdeploy pull {run_id} 'ckpt/*' --to {to}"
    ], h.view.steps
    assert not any("stopping every task" in s for s in h.view.steps)  # they had stopped
    a.deliver = None
    with Fleet(h.plan.hosts, connect=h.hosts.connect) as fleet:
        again = pull(fleet, run_id, ["ckpt/*"], to)
    assert a.ops("fetch")[-1]["offset"] == 2_000_000  # only the rest travelled
    assert (to / run_id / "worker-0" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert again.fetched_bytes == len(CKPT) - 2_000_000
    assert not (to / run_id / ".partial").exists()


def test_two_pulls_into_the_same_folder_at_once_both_succeed(tmp_path: Path) -> None:
    """The first transfer waits (2 s at most) for a second pull to ask for the same content:
    the second used to append to the same `.part`, and both failed, one claiming the file
    changed. Now it waits for the first and finds the file here."""
    hosts, _ = fleet_of(tmp_path)
    a = hosts["a"]

    def overlap(data: bytes, sink: Callable[[bytes], None], closed: threading.Event) -> None:
        sink(data[:1000])
        for _ in range(40):
            if len(a.ops("fetch")) > 1:
                break
            closed.wait(0.05)
        sink(data[1000:])

    a.deliver = overlap
    results: list[PullResult | BaseException] = []
    hosts_of_the_plan = plan(tmp_path, TWO_WORKERS).hosts

    def one_pull() -> None:
        with Fleet(hosts_of_the_plan, connect=hosts.connect) as fleet:
            try:
                results.append(pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out", tasks=["worker:0"]))
            except BaseException as exc:  # reported by the assertion below
                results.append(exc)

    pulls = [threading.Thread(target=one_pull) for _ in range(2)]
    for thread in pulls:
        thread.start()
    for thread in pulls:
        thread.join(30)
    assert all(isinstance(r, PullResult) for r in results), results
    assert (tmp_path / "out" / "r-1" / "worker-0" / "ckpt" / "model.bin").read_bytes() == CKPT
    assert sorted(r.fetched_files for r in results) == [0, 1]  # type: ignore[union-attr]
    assert len(a.ops("fetch")) == 1  # the content travelled once


def test_a_private_file_is_never_readable_by_others_while_it_arrives(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    hosts["a"].modes = {"ckpt/model.bin": 0o600}
    base = tmp_path / "out" / "r-1"
    seen: list[int] = []

    def look(data: bytes, sink: Callable[[bytes], None], closed: threading.Event) -> None:
        sink(data[:1000])
        seen.extend(p.stat().st_mode & 0o777 for p in base.rglob("*.part"))
        seen.extend(p.stat().st_mode & 0o777 for p in base.glob(".partial"))
        sink(data[1000:])

    hosts["a"].deliver = look
    umask = os.umask(0o022)
    try:
        with fleet:
            pull(fleet, "r-1", ["ckpt/*", "*.json"], tmp_path / "out", tasks=["worker:0"])
    finally:
        os.umask(umask)
    assert seen and set(seen) <= {0o600, 0o700}, [oct(m) for m in seen]
    assert (base / "worker-0" / "ckpt" / "model.bin").stat().st_mode & 0o777 == 0o600
    assert (base / "worker-0" / "log.json").stat().st_mode & 0o777 == 0o644


def test_pull_to_a_file_is_a_local_error_before_any_host_is_asked(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    (tmp_path / "out").write_text("a file")
    with fleet:
        error = the_error(lambda: pull(fleet, "r-1", ["*"], tmp_path / "out" / "deeper"))
    assert error.exit_status == ExitStatus.USAGE  # not 3, "a host is unreachable"
    assert (
        error.message
        == f"cannot pull into {tmp_path}/out/deeper: {tmp_path}/out is a file, not a folder"
    )
    assert not hosts["a"].ops("collect")


def test_a_folder_where_a_file_lands_is_a_local_error_before_any_byte(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    in_the_way = tmp_path / "out" / "r-1" / "worker-0" / "ckpt" / "model.bin"
    in_the_way.mkdir(parents=True)
    with fleet:
        error = the_error(lambda: pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out"))
    assert error.exit_status == ExitStatus.USAGE
    assert error.message == f"cannot write {in_the_way} here: Is a directory"
    assert error.hint and error.hint.startswith("a folder is where a file goes: move it away")
    assert not hosts["a"].ops("fetch") and not hosts["b"].ops("fetch")


def test_a_file_where_a_folder_goes_is_a_local_error_before_any_byte(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    in_the_way = tmp_path / "out" / "r-1" / "worker-0"
    in_the_way.parent.mkdir(parents=True)
    in_the_way.write_text("an earlier download, say")
    with fleet:
        error = the_error(lambda: pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out"))
    assert error.exit_status == ExitStatus.USAGE
    dest = in_the_way / "ckpt" / "model.bin"
    assert error.message == f"cannot write {dest} here: {in_the_way} is a file, not a folder"
    assert not hosts["a"].ops("fetch") and not hosts["b"].ops("fetch")


def test_a_file_with_a_250_character_name_comes_home(tmp_path: Path) -> None:
    """`<name>.<hash12>.part` beside it was 18 characters past the file system's 255."""
    hosts, fleet = fleet_of(tmp_path)
    name = "n" * 250
    hosts["a"].files["worker:0"][name] = b"long"
    with fleet:
        pull(fleet, "r-1", [name], tmp_path / "out")
    assert (tmp_path / "out" / "r-1" / "worker-0" / name).read_bytes() == b"long"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB file system of its own (tmpfs: needs root), unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_is_a_local_error_and_keeps_what_arrived(small_disk: Path) -> None:
    _, fleet = fleet_of(small_disk.parent)
    with fleet:
        error = the_error(lambda: pull(fleet, "r-1", ["ckpt/*"], small_disk, tasks=["worker:0"]))
    dest = small_disk / "r-1" / "worker-0" / "ckpt" / "model.bin"
    assert error.exit_status == ExitStatus.USAGE
    assert error.message == f"cannot write {dest} here: No space left on device"
    assert error.hint and error.hint.startswith("free some space there")
    assert "the same pull again fetches only the rest" in error.hint
    [part] = (small_disk / "r-1" / ".partial").glob("*.part")
    assert part.stat().st_size > 0  # kept for the next pull


def test_a_read_only_disk_is_a_local_error(small_disk: Path) -> None:
    hosts, fleet = fleet_of(small_disk.parent)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with fleet:
        error = the_error(lambda: pull(fleet, "r-1", ["ckpt/*"], small_disk / "x"))
    assert error.exit_status == ExitStatus.USAGE
    assert error.message == f"cannot write {small_disk}/x here: Read-only file system"
    assert not hosts["a"].ops("collect")


def test_a_pull_that_matched_nothing_says_so(tmp_path: Path) -> None:
    _, fleet = fleet_of(tmp_path)
    with fleet:
        result = pull(fleet, "r-1", ["nothing/*", "*.h5"], tmp_path / "out")
    assert result.summary() == (
        "no file matched nothing/*, *.h5 on worker:0@a, worker:1@b; nothing was pulled"
    )


def test_a_host_is_asked_for_its_next_files_before_the_first_has_arrived(
    tmp_path: Path,
) -> None:
    """No round trip between files: the host holds FETCH_AHEAD requests while one streams."""
    hosts, fleet = fleet_of(tmp_path)
    files = {f"ckpt/shard-{i}.bin": bytes([i]) * 100_000 for i in range(7)}
    hosts["a"].files = {"worker:0": files}
    asked_when_streaming: list[int] = []

    def deliver(data: bytes, sink: Callable[[bytes], None], closed: threading.Event) -> None:
        asked_when_streaming.append(len(hosts["a"].ops("fetch")))
        sink(data)

    hosts["a"].deliver = deliver
    with fleet:
        result = pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out", tasks=["worker:0"])
    base = tmp_path / "out" / "r-1" / "worker-0"
    assert {f"ckpt/{p.name}": p.read_bytes() for p in (base / "ckpt").iterdir()} == files
    assert result.fetched_files == 7
    # While the first file streamed, the host had FETCH_AHEAD requests; then one more per file
    # until none was left to ask for.
    assert asked_when_streaming == [4, 5, 6, 7, 7, 7, 7]
    assert FETCH_AHEAD == 4


def test_a_failed_file_mid_stream_stops_the_host_and_leaves_no_part_open(tmp_path: Path) -> None:
    """Files requested ahead of a failure are neither counted nor left open (their parts stay
    to resume)."""
    hosts, fleet = fleet_of(tmp_path)
    files = {f"ckpt/shard-{i}.bin": bytes([i]) * 100_000 for i in range(5)}
    hosts["a"].files = {"worker:0": files}

    gone: list[str] = []

    def deliver(data: bytes, sink: Callable[[bytes], None], closed: threading.Event) -> None:
        if not gone:  # the first file streams: the last is not asked for yet; it goes now
            asked = {r["path"] for r in hosts["a"].ops("fetch")}
            [last] = set(files) - asked
            del hosts["a"].files["worker:0"][last]
            gone.append(last)
        sink(data)

    hosts["a"].deliver = deliver
    before = len(os.listdir("/proc/self/fd"))
    with fleet, pytest.raises(HostsFailed) as failed:
        pull(fleet, "r-1", ["ckpt/*"], tmp_path / "out", tasks=["worker:0"])
    assert gone[0] in str(failed.value)
    assert len(os.listdir("/proc/self/fd")) <= before
    landed = {f"ckpt/{p.name}" for p in (tmp_path / "out" / "r-1" / "worker-0" / "ckpt").iterdir()}
    assert landed == set(files) - set(gone)
