"""The allocation one `up` holds (deployer/sources/slurm/held.py) and the holdings `up` keeps
(config.sources.Holdings, config.inventory.provision_hosts), without a cluster: Slurm's
commands answered by a scripted login node with the lab's Slurm 22.05 output forms, the lease
keeper a stand-in that records what it is told. What is checked is who ends an allocation and
how: once, by the `up` that holds it, never by a name shared with another inventory, with
every connection it opened closed.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployer.config.inventory import load_inventory as load_with
from deployer.config.inventory import provision_hosts
from deployer.config.model import Host
from deployer.config.schema import Table
from deployer.config.sources import (
    AT_DOWN,
    AT_JOB_END,
    Discovered,
    Holdings,
    Provisioned,
    Regained,
    Say,
    SourceContext,
    Sourced,
)
from deployer.core.errors import InventoryError
from deployer.hosts.transport import CommandResult
from deployer.sources import load_inventory
from deployer.sources.slurm import SlurmSource, allocation, held
from deployer.sources.slurm.allocation import Keeper, Running, ran_again
from deployer.sources.slurm.cluster import Cluster, SlurmRefused, login_host
from deployer.sources.slurm.held import HeldAllocation
from deployer.sources.slurm.outputs import parse_queue
from tests.support.helpers import JOB, write_toml
from tests.support.slurm_outputs import BASE, JOB_DETAIL, NODES, PARTITION


@dataclass
class Job:
    id: str
    name: str
    comment: str = "(null)"
    state: str = "RUNNING"
    reason: str = "None"


@dataclass
class LoginNode:
    """Slurm's commands as the lab's login node answers them, for the jobs in `jobs`; every
    transport made over it is counted, and its closes."""

    jobs: list[Job] = field(default_factory=list)
    pending: bool = False  # new allocations wait (Resources) instead of running at once
    interrupt_wait: bool = False  # the first squeue of a waiting allocation is a Ctrl-C
    opened: int = 0
    closed: int = 0
    commands: list[str] = field(default_factory=list)
    keepers: list[StandInKeeper] = field(default_factory=list)

    def transport(self) -> LoginTransport:
        self.opened += 1
        return LoginTransport(self)

    def answer(self, argv: Sequence[str]) -> CommandResult:
        self.commands.append(shlex.join(argv))
        if argv[:3] == ["scontrol", "show", "partition"]:
            return _ok(PARTITION)
        if argv[:3] == ["scontrol", "show", "node"]:
            return _ok(NODES)
        if argv[:3] == ["scontrol", "show", "job"]:
            return _ok(JOB_DETAIL)
        if argv[0] == "sbatch":
            if "--test-only" in argv:
                return _ok("")
            said = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            job = Job(str(100 + len(self.jobs)), said["job-name"], said["comment"])
            if self.pending:
                job.state, job.reason = "PENDING", "Resources"
            self.jobs.append(job)
            return _ok(f"{job.id}\n")
        if argv[0] == "scancel":
            for job in self.jobs:
                if job.id == argv[1]:
                    job.state = "CANCELLED"
            return _ok("")
        if argv[0] == "squeue":
            live = [j for j in self.jobs if j.state in ("RUNNING", "PENDING")]
            if "-j" in argv:
                wanted = argv[argv.index("-j") + 1]
                found = [j for j in self.jobs if j.id == wanted]
                if self.interrupt_wait and found and found[0].state == "PENDING":
                    raise KeyboardInterrupt
                return _ok("".join(_line(j) for j in found))
            name = argv[argv.index("-n") + 1]
            return _ok("".join(_line(j) for j in live if j.name == name))
        raise AssertionError(f"unexpected command {argv}")


def _ok(out: str) -> CommandResult:
    return CommandResult(0, out.encode(), b"")


def _line(job: Job) -> str:
    nodes = "h2-ec7e,h3-ec7e" if job.state == "RUNNING" else ""
    return f"{job.id}|{job.state}|0:05|59:55|2|gpu|{nodes}|{job.comment}|{job.reason}\n"


class LoginTransport:
    name = "login.example.edu (Slurm login)"

    def __init__(self, login: LoginNode) -> None:
        self.login = login

    def run(self, argv: Sequence[str], **_: Any) -> CommandResult:
        return self.login.answer(argv)

    def close(self) -> None:
        self.login.closed += 1


class StandInKeeper:
    """What the lease keeper is told, in order, and whether its session was closed."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.closed = False
        self.lock = threading.Lock()
        self.name = "keeper"

    def request(self, data: bytes, timeout: float | None) -> bytes:
        self.told.append(data.decode().strip())
        return b"ok\n"

    def close(self) -> None:
        self.closed = True

    def as_keeper(self) -> Keeper:
        return Keeper(self, self)  # type: ignore[arg-type]  # its session, and its connection


@pytest.fixture
def login(monkeypatch: pytest.MonkeyPatch) -> LoginNode:
    """Every SlurmSource's cluster over one scripted login node; keepers are stand-ins."""
    node = LoginNode()

    def cluster(self: SlurmSource) -> Cluster:
        transport: Any = node.transport()
        return Cluster(transport, login_host(self.settings, self.ssh))

    def start_keeper(cluster: Cluster, job_id: str, first: str) -> Keeper:
        node.keepers.append(StandInKeeper())
        return node.keepers[-1].as_keeper()

    monkeypatch.setattr(SlurmSource, "cluster", cluster)
    monkeypatch.setattr(allocation, "start_keeper", start_keeper)
    return node


def _source(tmp_path: Path, extra: str = "", name: str = "inv.toml") -> SlurmSource:
    path = tmp_path / name
    path.write_text(BASE.format(extra=extra, group=""))
    (source,) = load_inventory(path).pending
    assert isinstance(source, SlurmSource)
    return source


def _provision(source: SlurmSource, said: list[str]) -> HeldAllocation:
    provisioned = source.provision("inv.toml", said.append)
    assert isinstance(provisioned.held, HeldAllocation)
    assert [h.name for h in provisioned.found.hosts] == ["h2-ec7e", "h3-ec7e"]
    return provisioned.held


def _states(login: LoginNode) -> dict[str, str]:
    return {j.id: j.state for j in login.jobs}


def test_the_up_that_holds_an_allocation_releases_it_once_and_closes_its_connection(
    tmp_path: Path, login: LoginNode
) -> None:
    said: list[str] = []
    allocation_ = _provision(_source(tmp_path), said)
    assert said[0] == "submitted allocation 100: 2 nodes in gpu for 02:00:00"
    assert said[-1].startswith("allocation 100 runs on h2-ec7e, h3-ec7e")
    assert _states(login) == {"100": "RUNNING"} and login.closed == 0
    allocation_.end(said.append)
    assert said[-1] == "released allocation 100"
    assert _states(login) == {"100": "CANCELLED"}
    (keeper,) = login.keepers
    assert keeper.closed and keeper.told == []
    assert login.closed == login.opened == 1
    commands = len(login.commands)
    allocation_.end(said.append)  # a second end (a caller's finally after its own) does nothing
    assert said[-1] == "released allocation 100" and len(login.commands) == commands


def test_two_inventories_of_one_job_in_one_process_hold_nothing_of_each_other(
    tmp_path: Path, login: LoginNode
) -> None:
    """Before, the allocation was held by its job's name in a module-wide table, which a second
    inventory of the job in the same process shared (and its end ended the first's). Now the
    second is refused, as from another process, and ending it ends nothing of the first."""
    said: list[str] = []
    first = _provision(_source(tmp_path, name="a.toml"), said)
    with pytest.raises(SlurmRefused, match=r"the job already has allocation 100 \(running"):
        _source(tmp_path, name="b.toml").provision("b.toml", said.append)
    assert _states(login) == {"100": "RUNNING"}, "the refused up ended the first one's allocation"
    assert login.closed == 1  # the refused one's connection, not the first's
    first.end(said.append)
    assert _states(login) == {"100": "CANCELLED"} and login.closed == 2


def test_a_detached_runs_allocation_is_handed_over_and_not_released_at_the_end(
    tmp_path: Path, login: LoginNode
) -> None:
    said: list[str] = []
    allocation_ = _provision(_source(tmp_path), said)
    allocation_.hand_over(said.append)
    assert said[-1] == held.DETACHED
    allocation_.end(said.append)  # up's end after the hand-over: nothing left to end
    assert said[-1] == held.DETACHED
    assert _states(login) == {"100": "RUNNING"}
    (keeper,) = login.keepers
    assert keeper.told == ["detached"] and keeper.closed
    assert login.closed == login.opened == 1


def test_keep_allocation_keeps_it_for_the_next_up_which_takes_it_again(
    tmp_path: Path, login: LoginNode
) -> None:
    said: list[str] = []
    source = _source(tmp_path, "keep_allocation = true\n")
    _provision(source, said).end(said.append)
    assert said[-1] == held.KEPT and _states(login) == {"100": "RUNNING"}
    again = _provision(source, said)
    assert "using allocation 100, kept by the last up" in said
    again.end(said.append)
    assert said[-1] == held.KEPT and _states(login) == {"100": "RUNNING"}
    assert [k.told for k in login.keepers] == [["keep"], ["keep", "keep"]]
    assert all(k.closed for k in login.keepers) and login.closed == login.opened == 2


def test_ctrl_c_while_the_allocation_waits_cancels_it_and_closes_the_connection(
    tmp_path: Path, login: LoginNode
) -> None:
    login.pending = login.interrupt_wait = True
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _source(tmp_path).provision("inv.toml", said.append)
    assert said[-1] == "cancelled allocation 100"
    assert _states(login) == {"100": "CANCELLED"}
    assert login.closed == login.opened == 1 and login.keepers == []


def test_status_and_down_close_the_connections_they_open(tmp_path: Path, login: LoginNode) -> None:
    said: list[str] = []
    source = _source(tmp_path)
    _provision(source, said)  # held by an up elsewhere: down cancels it all the same
    found = source.discover("inv.toml")
    assert [h.name for h in found.hosts] == ["h2-ec7e", "h3-ec7e"]
    source.terminate(AT_JOB_END, said.append)  # up's end is the holder's, not the source's
    assert _states(login) == {"100": "RUNNING"}
    source.terminate(AT_DOWN, said.append)
    assert said[-1] == "released allocation 100 (running)"
    assert _states(login) == {"100": "CANCELLED"}
    assert login.closed == login.opened - 1  # all but the holder's own, which its up closes


def test_a_requeue_is_told_from_a_run_that_went_on_by_when_the_allocation_started() -> None:
    (job,) = parse_queue("7|RUNNING|0:10|9:50|2|gpu|h2,h3|(null)|None\n", "squeue")
    started = 1000.0
    running = Running("7", ("h2", "h3"), since=started)
    assert not ran_again(running, job, now=started + 10)  # the same start: it ran on
    assert ran_again(running, job, now=started + 60)  # started 50 s after the run began


# ---- Holdings, and provisioning that fails half-way --------------------------------------


@dataclass
class Ledger:
    """What the stand-in holdings were asked, in order."""

    calls: list[str] = field(default_factory=list)


@dataclass
class StandInHeld:
    name: str
    ledger: Ledger
    fails: bool = False

    def regain(self, say: Say) -> Regained | None:
        self.ledger.calls.append(f"regain {self.name}")
        return None

    def hand_over(self, say: Say) -> None:
        self.ledger.calls.append(f"hand_over {self.name}")

    def end(self, say: Say) -> None:
        self.ledger.calls.append(f"end {self.name}")
        if self.fails:
            raise SlurmRefused(f"{self.name} could not be released")


def test_every_holding_is_ended_though_one_fails_and_the_first_failure_is_raised() -> None:
    ledger = Ledger()
    holdings = Holdings(
        (StandInHeld("a", ledger, fails=True), StandInHeld("b", ledger, fails=True))
    )
    with pytest.raises(SlurmRefused, match="a could not be released"):
        holdings.end(print)
    assert ledger.calls == ["end a", "end b"]
    assert holdings.regain(print) is None and ledger.calls[-2:] == ["regain a", "regain b"]


@dataclass(frozen=True)
class Pool:
    """A source that holds something for `up` ("pool"), or fails to provision ("broken")."""

    table: Table
    ledger: Ledger
    broken: bool
    key: str = "pool"

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        return Discovered(hosts=())

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        if self.broken:
            self.ledger.calls.append("provision failed")
            raise InventoryError(file, self.table.path, "no machines left")
        return Provisioned(Discovered(hosts=()), StandInHeld(self.table.path, self.ledger))

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        return None

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        """Nothing of its own to end: what it holds is the holding's."""


def test_a_source_that_fails_to_provision_ends_what_the_ones_before_it_hold(
    tmp_path: Path,
) -> None:
    ledger = Ledger()

    def reader(broken: bool) -> Any:
        def read(t: Table, context: SourceContext) -> Sourced:
            return Sourced(pending=Pool(t, ledger, broken))

        return lambda: read

    path = write_toml(tmp_path, JOB + "[good]\n[bad]\n")
    inventory = load_with(path, {"good": reader(False), "bad": reader(True)})
    with pytest.raises(InventoryError, match="no machines left"):
        provision_hosts(inventory, print)
    assert ledger.calls == ["provision failed", "end good"]
    ledger.calls.clear()
    only_good = load_with(write_toml(tmp_path, JOB + "[good]\n"), {"good": reader(False)})
    _, holdings = provision_hosts(only_good, print)
    assert ledger.calls == [] and len(holdings.held) == 1  # held for up to end, not ended here
