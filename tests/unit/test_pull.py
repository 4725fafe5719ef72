"""`tfdeploy pull` and job.artifacts on scripted hosts: only missing contents travel, once per
content, interrupted pulls resume, nothing lands outside the destination, and artifacts come
home however `up` ends. The host side (globs, symlinks, `..`) runs for real in
tests/integration/test_results.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deployer.core.errors import HostError, Interrupted, JobFailed
from deployer.hosts.fleet import Fleet
from deployer.results.pull import pull
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


def test_an_interrupted_pull_resumes_where_it_stopped(tmp_path: Path) -> None:
    hosts, fleet = fleet_of(tmp_path)
    dest = tmp_path / "out" / "r-1" / "worker-0" / "ckpt" / "model.bin"
    dest.parent.mkdir(parents=True)
    sha = hashlib.sha256(CKPT).hexdigest()
    part = dest.with_name(f"model.bin.{sha[:12]}.part")
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
    with fleet, pytest.raises(HostError) as info:
        pull(fleet, "r-1", ["*"], tmp_path / "out")
    assert "would land outside" in info.value.message
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
