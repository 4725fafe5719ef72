"""The hosts of a job as one group: one reused connection each, and bounded parallel calls."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from deployer.agent import Agent
from deployer.errors import HostError, HostsFailed
from deployer.inventory import Host
from deployer.transport import LocalTransport, SSHTarget, SSHTransport, Transport

T = TypeVar("T")
DEFAULT_CONCURRENCY = 32


def open_transport(host: Host) -> Transport:
    """Picks how to reach a host; SSH settings come from the inventory (host overrides [ssh])."""
    if host.transport == "local":
        return LocalTransport(host.name)
    ssh = host.ssh
    return SSHTransport(
        SSHTarget(
            name=host.name,
            address=host.address,
            port=ssh.port,
            user=ssh.user,
            identity=ssh.identity,
            jump=ssh.jump,
            host_keys=ssh.host_keys,
            known_hosts=ssh.known_hosts,
            connect_timeout=ssh.connect_timeout,
            ssh_config=ssh.ssh_config,
        )
    )


@dataclass
class Member:
    host: Host
    agent: Agent

    @property
    def name(self) -> str:
        return self.host.name


class Fleet:
    """Connections to a set of hosts; `each` runs a function on all of them in parallel."""

    def __init__(self, hosts: Iterable[Host], *, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.members = [
            Member(h, Agent(open_transport(h), python=h.python, workdir=h.workdir)) for h in hosts
        ]
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(self.members))))

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

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

    def each_settled(
        self, fn: Callable[[Member], T], members: Iterable[Member] | None = None
    ) -> tuple[dict[str, T], list[HostError]]:
        """Like each, but returns the failures instead of raising (teardown must reach them all)."""
        chosen = list(self.members if members is None else members)
        futures = {m.name: self._pool.submit(fn, m) for m in chosen}
        results: dict[str, T] = {}
        failures: list[HostError] = []
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except HostError as exc:
                failures.append(exc)
            except OSError as exc:  # a socket error the transport did not classify
                failures.append(HostError(name, f"connection failed: {exc}"))
        return results, failures

    def close(self) -> None:
        for m in self.members:
            with contextlib.suppress(Exception):
                m.agent.transport.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
