"""A local port forwarded to a task's host while the task runs (`tfdeploy tunnel`): TensorBoard
or any dashboard on a host's loopback, opened here without touching a firewall.

    with tunnel(run_id, 6006, task="chief:0") as forward:
        print(forward.url)
        forward.wait()  # until the task ends
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from deployer.api.actions import Say, discovered
from deployer.core.errors import HostError, UsageError
from deployer.hosts.fleet import Fleet, Member
from deployer.results.runs import find_runs, resolve, task_ended, task_host
from deployer.results.tunnel import Tunnel, allow_many_files

TASK_CHECK_S = 2.0  # how often `wait` asks whether the task still runs


class Forward:
    """An open tunnel: 127.0.0.1:`local_port` here -> 127.0.0.1:`remote_port` on `host`, where
    `task` of run `run_id` runs. `errors` lists the connections that failed."""

    def __init__(self, tunnel: Tunnel, member: Member, run_id: str, task: str) -> None:
        self._tunnel, self._member = tunnel, member
        self.run_id, self.task, self.host = run_id, task, member.name

    @property
    def url(self) -> str:
        return self._tunnel.url

    @property
    def local_port(self) -> int:
        return self._tunnel.local_port

    @property
    def remote_port(self) -> int:
        return self._tunnel.remote_port

    @property
    def errors(self) -> list[str]:
        return list(self._tunnel.errors)

    def wait(self, say: Say | None = None) -> str:
        """Blocks until the task ends and returns how it ended ("exit code 0", ...); `say`
        receives each failed connection and each time the host could not be asked."""
        say = say or _nothing
        reported, checked = 0, time.monotonic()
        while True:
            time.sleep(0.5)
            errors = self._tunnel.errors
            for error in errors[reported:]:
                say(f"a connection failed: {error}")
            reported = len(errors)
            if time.monotonic() - checked < TASK_CHECK_S:
                continue
            checked = time.monotonic()
            try:
                ended = self._ended()
            except HostError as exc:  # its connections fail too, and say so; it may come back
                say(f"could not ask {self.host} whether {self.task} runs: {exc.cause}")
                continue
            if ended is not None:
                return ended

    def _ended(self) -> str | None:
        poll = self._member.agent.poll(self.run_id, {}, max_bytes=0, heartbeat=False)
        status = next((t for t in poll.tasks if t.name == self.task), None)
        if status is None:
            return "gone from its host"
        return status.outcome() if status.finished else None


@contextmanager
def tunnel(
    run_id: str,
    remote_port: int,
    *,
    task: str | None = None,
    local_port: int = 0,
    inventory: str | None = None,
) -> Iterator[Forward]:
    """Forwards a local port (`local_port`; 0: any free one) to `remote_port` on the loopback
    of the host where `task` (default: the chief, else worker:0) of the run runs, over SSH,
    until the block ends. Only this machine's loopback listens.

    Raises UsageError when the run has no such task, or the task has ended."""
    target = discovered(resolve(run_id, inventory))
    if target.run_id is None:
        raise UsageError("tunnel needs a run id (see `tfdeploy status INVENTORY`)")
    with Fleet(target.hosts) as fleet:
        runs = find_runs(fleet, target)
        host, name = task_host(runs, task)
        ended = task_ended(runs, name)
        if ended is not None:
            raise UsageError(
                f"{name} of run {target.run_id} has ended ({ended}): nothing of it serves "
                "any more, so no tunnel was opened",
                hint=f"`tfdeploy status {target.run_id}` shows the run's tasks",
            )
        member = fleet.member(host)
        allow_many_files()
        with Tunnel(member.agent.transport, remote_port, local_port) as opened:
            yield Forward(opened, member, target.run_id, name)


def _nothing(_: str) -> None:
    pass
