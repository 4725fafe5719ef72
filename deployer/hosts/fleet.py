"""The hosts of a job as one group: one reused connection each, and bounded parallel calls."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from deployer.config.model import Host, SSHSettings
from deployer.core.errors import HostError, HostsFailed
from deployer.hosts.agent import Agent
from deployer.hosts.local_transport import LocalTransport
from deployer.hosts.transport import Transport

if TYPE_CHECKING:
    from deployer.hosts.shared_ssh import SharedSSH

T = TypeVar("T")
DEFAULT_CONCURRENCY = 32
CLOSE_WAIT_S = 2.0  # how long close() waits for connections to shut before leaving them be
# A worker with nothing to do for this long leaves: a fleet held open for a whole job keeps no
# idle threads, and one round after another (up makes eight) reuses the same ones.
WORKER_IDLE_S = 5.0


def open_transport(host: Host) -> Transport:
    """Picks how to reach a host; SSH settings come from the inventory (host overrides [ssh]).
    The SSH stack (paramiko: a tenth of a second of imports) loads when a host needs it,
    so `plan`, `--help` and local runs start without it."""
    if host.via is not None:  # a scheduler's node: job steps launched from its login node
        from deployer.hosts.step_transport import StepTransport

        return StepTransport(host.name, _login_transport(host), host.via.launcher)
    if host.transport == "local":
        return LocalTransport(host.name)
    from deployer.hosts.ssh import Endpoint
    from deployer.hosts.ssh_transport import SSHTransport

    return SSHTransport(Endpoint(host.name, host.address, host.ssh))


def _login_transport(host: Host) -> Transport:
    """The login node a `via` host is reached through: this machine, or SSH with the host's
    ssh settings (the login's, which the source gave it). Named after the host, so errors
    say whose command failed."""
    assert host.via is not None
    if host.via.login == "local":
        return LocalTransport(host.name, env=scheduler_env())
    from deployer.hosts.ssh import Endpoint
    from deployer.hosts.ssh_transport import SSHTransport

    return SSHTransport(Endpoint(host.name, host.via.login, host.ssh))


def scheduler_env() -> dict[str, str]:
    """What a local login keeps of this machine's environment besides a login's: the Slurm
    client's own configuration (`SLURM_CONF`), which says where the cluster is."""
    import os

    return {k: v for k, v in os.environ.items() if k == "SLURM_CONF"}


@dataclass
class Member:
    host: Host
    agent: Agent

    @property
    def name(self) -> str:
        return self.host.name


class Fleet:
    """Connections to a set of hosts; `each` runs a function on all of them in parallel.

    Calls run on daemon worker threads, at most `concurrency` at once. A call abandoned by
    Ctrl-C (a slow push, a hanging connect) must neither delay the urgent stop that follows nor
    keep the process alive at exit, which a ThreadPoolExecutor's joined workers would do. The
    workers are reused from call to call: a new thread per call cost twice the CPU of the call
    itself (a thread's start, and every waiting thread contending for the GIL), about 0.2 ms per
    host per round at 128 hosts.
    """

    def __init__(
        self,
        hosts: Iterable[Host],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        connect: Callable[[Host], Transport] | None = None,
    ) -> None:
        # connect: how to reach a host; tests pass scripted hosts (tests/support/fakehost.py) here.
        self._logins: dict[tuple[str, SSHSettings], SharedSSH] = {}
        self._logins_lock = threading.Lock()
        self._connect = connect or self._open
        self.members = [self._member(h) for h in hosts]
        self._by_name = {m.name: m for m in reversed(self.members)}  # the first of a name wins
        self._limit = max(1, concurrency)
        self._queue: deque[Callable[[], None]] = deque()
        self._queued = threading.Condition()  # guards _queue, _idle, _workers
        self._idle = 0  # workers waiting for a call
        self._workers = 0
        self._busy: dict[str, int] = {}  # host -> calls in flight
        self._busy_lock = threading.Lock()

    def _member(self, host: Host) -> Member:
        return Member(host, Agent(self._connect(host), python=host.python, workdir=host.workdir))

    def _open(self, host: Host) -> Transport:
        """open_transport, but the hosts reached through one login node over SSH (a Slurm
        allocation's nodes, as job steps) share the fleet's connection to it (shared_ssh.py):
        `status` or `down` of a 64-node job opens one, not 64. Closed with the fleet."""
        via = host.via
        if via is None or via.login == "local":
            return open_transport(host)
        from deployer.hosts.shared_ssh import SharedSSH
        from deployer.hosts.ssh import Endpoint
        from deployer.hosts.step_transport import StepTransport

        with self._logins_lock:
            shared = self._logins.get((via.login, host.ssh))
            if shared is None:
                shared = SharedSSH(Endpoint(f"{via.login} (login node)", via.login, host.ssh))
                self._logins[(via.login, host.ssh)] = shared
        return StepTransport(host.name, shared.view(host.name), via.launcher)

    def add(self, host: Host) -> Member:
        """A host that joins while the job runs (a replacement for a lost or preempted one)."""
        member = self._member(host)
        self.members.append(member)
        self._by_name.setdefault(member.name, member)
        return member

    def renew(self, host: Host) -> Member:
        """A host back after its connection ended with it (a requeued Slurm allocation's node):
        a fresh connection in the place of the old one of its name, which is closed."""
        old = self._by_name.get(host.name)
        if old is None:
            return self.add(host)
        member = self._member(host)
        self.members[self.members.index(old)] = member
        self._by_name[host.name] = member
        _close_quietly(old)
        return member

    def member(self, name: str) -> Member:
        return self._by_name[name]

    def each(
        self,
        fn: Callable[[Member], T],
        members: Iterable[Member] | None = None,
        *,
        what: str = "preflight failed",
    ) -> dict[str, T]:
        """Calls fn on every member at once; if any host fails, raises one error naming them all."""
        chosen = list(self.members if members is None else members)
        results, failures = self.each_settled(fn, chosen)
        if failures:
            raise HostsFailed(failures, what=what)
        return results

    def submit(
        self, fn: Callable[[Member], T], member: Member, *, urgent: bool = False
    ) -> Pending[T]:
        """Starts fn(member) on a worker thread; the caller collects it when it is done.

        urgent: a thread of its own, past the concurrency limit, for the forced stop of a second
        Ctrl-C while the graceful stops still occupy every worker.
        """
        pending: Pending[T] = Pending(member.name)

        def work() -> None:
            with self._busy_lock:
                self._busy[member.name] = self._busy.get(member.name, 0) + 1
            try:
                pending.set_result(fn(member))
            except BaseException as exc:  # handed to the collecting thread
                pending.set_exception(exc)
            finally:
                with self._busy_lock:
                    self._busy[member.name] -= 1

        if urgent:
            threading.Thread(target=work, name=f"fleet-{member.name}", daemon=True).start()
            return pending
        with self._queued:
            self._queue.append(work)
            if len(self._queue) > self._idle and self._workers < self._limit:
                self._workers += 1
                threading.Thread(target=self._worker, name="fleet-worker", daemon=True).start()
            self._queued.notify()
        return pending

    def _worker(self) -> None:
        while True:
            with self._queued:
                self._idle += 1
                while not self._queue:
                    if not self._queued.wait(WORKER_IDLE_S) and not self._queue:
                        self._idle -= 1
                        self._workers -= 1
                        return
                self._idle -= 1
                work = self._queue.popleft()
            work()

    def each_settled(
        self,
        fn: Callable[[Member], T],
        members: Iterable[Member] | None = None,
        *,
        urgent: bool = False,
    ) -> tuple[dict[str, T], list[HostError]]:
        """Like each, but returns the failures instead of raising (teardown must reach them all)."""
        chosen = list(self.members if members is None else members)
        pendings = [self.submit(fn, m, urgent=urgent) for m in chosen]
        results: dict[str, T] = {}
        failures: list[HostError] = []
        for pending in pendings:
            pending.wait()  # interruptible: Ctrl-C reaches the caller at once
            try:
                results[pending.host] = pending.result()
            except HostError as exc:
                failures.append(exc)
        return results, failures

    def interrupt(self) -> list[str]:
        """Drops the connection of every host with a call in flight; returns their names.

        After Ctrl-C the stop must not queue behind megabytes of a push still in the socket's
        send buffer (on a slow link, many seconds): a fresh connection carries it at once.
        """
        with self._busy_lock:
            # A call outside the fleet counts too.
            busy = [m for m in self.members if self._busy.get(m.name) or m.agent.busy]
        self._close_all(busy)
        return [m.name for m in busy]

    def close(self) -> None:
        """Closes every connection; one stuck behind a transfer is left to die with the process.

        Idle connections close on the fleet's own workers: a thread started for each cost more
        CPU than its close (~0.15 ms per host, every verb). One with a call still in flight
        (an exception or Ctrl-C left it) gets a thread of its own, as interrupt() does."""
        with self._busy_lock:
            busy = {m.name for m in self.members if self._busy.get(m.name) or m.agent.busy}
        closing = [self.submit(_close_quietly, m) for m in self.members if m.name not in busy]
        self._close_all([m for m in self.members if m.name in busy])
        deadline = time.monotonic() + CLOSE_WAIT_S
        for pending in closing:
            if not pending.wait(max(0.0, deadline - time.monotonic())):
                break
        with self._logins_lock:
            logins, self._logins = list(self._logins.values()), {}
        for shared in logins:  # after its hosts' channels: the login connections themselves
            shared.close()

    @staticmethod
    def _close_all(members: list[Member]) -> None:
        closers = [threading.Thread(target=_close_quietly, args=(m,), daemon=True) for m in members]
        for thread in closers:
            thread.start()
        for thread in closers:
            thread.join(timeout=CLOSE_WAIT_S)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_quietly(member: Member) -> None:
    # The connection first: closing a session sends a message, which on a connection still
    # busy with a stream's bytes (the fan-out seed's) waits behind them, past _close_all's
    # join; the late close then dropped the fresh connection the stop had opened meanwhile.
    with contextlib.suppress(Exception):
        member.agent.transport.close()
    with contextlib.suppress(Exception):
        member.agent.close_session()


class Pending(Future[T]):
    """The outcome of one call started by Fleet.submit: a Future that knows its host, and whose
    result turns a socket error the transport did not classify into a HostError naming it."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the call finished within timeout (None: waits for it)."""
        done, _ = futures_wait([self], timeout)
        return bool(done)

    def result(self, timeout: float | None = None) -> T:
        try:
            return super().result(timeout)
        except OSError as exc:  # HostError is no OSError: it passes as it is
            raise HostError(self.host, f"connection failed: {exc}") from exc
