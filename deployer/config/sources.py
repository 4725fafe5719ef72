"""Host sources: what a plug-in such as `[aws]` must do across a job's whole life.

The parser reads `[[hosts]]` itself; any other top-level table that lists hosts is a source,
handed to `load_inventory` by whoever wires the program together (deployer/sources/__init__.py
for the CLI; a test may pass its own). The rest of tfdeploy sees only `HostSource`: `plan` asks
it to describe what it found, `up` to provision and to replace a lost host, `down` and `up`'s end
to terminate. What a source holds for one `up` (a Slurm allocation) is a `Held` that `provision`
hands to that `up`, which keeps it and ends it. No module outside deployer/sources names a source
(an import-linter contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from deployer.config.schema import Table

if TYPE_CHECKING:
    from deployer.config.model import Host, Job, SSHSettings

Say = Callable[[str], None]  # how a source tells the user what it does (launches, waits)

# When a source may end the machines it created (`terminate(when)`): as `up` ends, at `down`,
# and with `down --terminate`, at any of them, "never" included.
AT_JOB_END = ("job-end",)
AT_DOWN = ("down",)
ANY_TIME = ("down", "job-end", "never")


@dataclass(frozen=True)
class SourceContext:
    """What a host source may use besides its own table."""

    file: str  # the inventory, for messages
    directory: Path  # absolute: relative files in the inventory are relative to it, never the cwd
    job: Job
    ssh: SSHSettings  # [ssh]: the defaults that each host's own ssh table overrides


@dataclass(frozen=True)
class SourceTable:
    """How a source shows what it found, in `plan`'s table and `plan --json`; plain data, so
    the renderers need no knowledge of the source."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    json_key: str  # the key of `documents` in `plan --json`, e.g. "instances"
    documents: tuple[dict[str, Any], ...] = ()
    to_launch: int = 0  # machines `up` would create first: `check` cannot check them yet
    # `status` shows it above the runs (a Slurm allocation's state and time left); a table of
    # what merely exists (EC2 instances) stays `plan`'s.
    in_status: bool = False
    # The most these machines may cost a run, in USD (`[aws] max_cost`): the run's cost guard
    # stops it there (deployer/up/guards.py prices them; None: no cap).
    max_cost: float | None = None


@dataclass(frozen=True)
class Deadline:
    """A time at which the hosts go away whatever the job does: a Slurm allocation's time
    limit. The watch warns before it and says when the tasks get their warning signal
    (deployer/watch/deadlines.py); the source only knows the numbers."""

    what: str  # "Slurm allocation 17"
    ends_at: float  # Unix seconds
    signal: tuple[str, int] | None = None  # ("USR1", 300): the tasks get SIGUSR1 300 s before


@dataclass(frozen=True)
class Discovered:
    """What a source found: hosts in order, the machines behind them, and how to show them."""

    hosts: tuple[Host, ...]
    instances: tuple[Any, ...] = ()  # e.g. EC2 instances; only the source knows their type
    table: SourceTable | None = None
    deadlines: tuple[Deadline, ...] = ()  # when `up` provisioned: the hosts' time limits


@dataclass(frozen=True)
class Regained:
    """A source's hosts given back after all of them were taken at once (a requeued Slurm
    allocation that runs again): each old host's name -> the host now in its place (the same
    name when the machine is the same), and the new hosts' time limits."""

    hosts: Mapping[str, Host]
    deadlines: tuple[Deadline, ...] = ()


class Held(Protocol):
    """What a source holds for one `up`, from `provision` to the end of that `up`: a Slurm
    allocation, with the lease keeper that holds it and the connections it opened.

    The `up` that provisioned it keeps it and ends it, once: `hand_over` when its run goes on
    without it (`up --detach`), and `end` in any case (after a hand-over, `end` has nothing
    left to do). It is held by this object and by no name: two inventories of one job in one
    process hold two, and nothing is released at exit behind its owner's back (before, a
    module-wide table by job name and an atexit handler shared that ownership)."""

    def connect(self, host: Host) -> Any:
        """How `up` reaches `host` when it is one of the held hosts: a deployer.hosts
        Transport over the connections this holding opened (a Slurm allocation's nodes as job
        steps over its one login connection); None: as any host. Typed Any because the
        transport interface lives in a layer above this one (deployer/hosts/transport.py)."""
        ...

    def regain(self, say: Say) -> Regained | None:
        """After every held host was lost at once: the same places again once the source
        gives them back (a requeued allocation that runs again, waited for as long as that
        takes); None: it will not (they were lost otherwise)."""
        ...

    def hand_over(self, say: Say) -> None:
        """A detached run goes on without this `up`: what is held becomes the run's (the
        allocation lasts while the run's tasks do); this `up` no longer holds it."""
        ...

    def end(self, say: Say) -> None:
        """The `up` ends, however it ends: released (or kept for the next `up`, where the
        source says so), every connection it opened closed. Idempotent."""
        ...


@dataclass(frozen=True)
class Provisioned:
    """What `provision` gives `up`: the hosts, and what the source holds for the run from now
    on (None: nothing, as when machines are only found or launched)."""

    found: Discovered
    held: Held | None = None


@dataclass(frozen=True)
class Holdings:
    """Every source's `Held` of one `up`, kept by that `up` from provisioning to its end."""

    held: tuple[Held, ...] = ()

    def connect(self, host: Host) -> Any:
        """The transport of the holding that holds `host`; None: no holding does."""
        for held in self.held:
            transport = held.connect(host)
            if transport is not None:
                return transport
        return None

    def regain(self, say: Say) -> Regained | None:
        """The first holding that gives its hosts back (a source takes them all at once)."""
        for held in self.held:
            back = held.regain(say)
            if back is not None:
                return back
        return None

    def hand_over(self, say: Say) -> None:
        for held in self.held:
            held.hand_over(say)

    def end(self, say: Say) -> None:
        """Each holding ended, whatever the one before raised (a failed release must not
        leave the next allocation held); the first error is raised once all were tried."""
        failed: list[BaseException] = []
        for held in self.held:
            try:
                held.end(say)
            except BaseException as exc:  # Ctrl-C too: the others are ended all the same
                failed.append(exc)
        if failed:
            raise failed[0]


class HostSource(Protocol):
    """A source whose hosts only I/O can find, and that may create and end machines."""

    @property
    def key(self) -> str:
        """The top-level table this source was read from, e.g. "aws"."""
        ...

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        """The hosts, or a TfdeployError naming `file` and the key at fault. `preview` (for
        `plan`) adds stand-ins for machines `provision` would create; nothing contacts them."""
        ...

    def provision(self, file: str, say: Say, *, detach: bool = False) -> Provisioned:
        """`up`'s discovery: creates what is missing first, waits until it answers SSH, and
        hands over what it holds for the run (the caller ends it). `detach`: for `up
        --detach`, whose run must outlive `up` on these hosts (a source that cannot promise
        that refuses here, before it creates anything). What it holds when it fails, it ends."""
        ...

    def replace(self, file: str, gone: Host, say: Say) -> Host | None:
        """A new machine in the place of `gone` (lost or preempted); None: not possible."""
        ...

    def terminate(self, when: tuple[str, ...], say: Say) -> None:
        """Ends the machines tfdeploy created whose end is due at `when` ("job-end", "down"...);
        never one it only discovered, nor what a `Held` holds (its `up` ends that)."""
        ...


@dataclass(frozen=True)
class Sourced:
    """What a source reads from its table: hosts known now, and/or a source to discover later."""

    hosts: tuple[Host, ...] = ()
    pending: HostSource | None = None


SourceReader = Callable[[Table, SourceContext], Sourced]
# Table name -> a function that returns its reader: a source's module is imported only by an
# inventory that has its table (so `[aws]` costs nothing, and needs no boto3, elsewhere).
SourceReaders = Mapping[str, Callable[[], SourceReader]]
