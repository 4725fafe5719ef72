"""What every host source that starts machines shares, whatever starts them (EC2, a lab, ...).

A source launches, then: pins each new machine's host key to fingerprints it learnt out of band
(`expecting`), waits until every machine answers SSH with that key (`wait_for_ssh`, all at
once), ends what it launched when that wait fails (`ended_on_failure`), and at `up`'s end or at
`down` ends what it launched whose `terminate_after` is due (`end_due`). What is particular to
a source (its API, its names, how it finds its own machines) stays in its package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from deployer.config.model import Host
from deployer.config.sources import Say
from deployer.core.errors import HostError, HostKeyRefused, HostsFailed
from deployer.core.text import plural
from deployer.hosts.fleet import open_transport

G = TypeVar("G")
POLL_S = 2.0  # between connection attempts to a machine that does not answer yet
# Machines waited on at once: each wait is mostly sleeping, but an attempt is a handshake.
MAX_PARALLEL = 64


def expecting(host: Host, fingerprints: tuple[str, ...]) -> Host:
    """`host`, whose SSH key must be one of `fingerprints` (none learnt: unchanged)."""
    if not fingerprints:
        return host
    return dataclasses.replace(host, ssh=dataclasses.replace(host.ssh, expected_keys=fingerprints))


def wait_for_ssh(
    hosts: Sequence[Host],
    deadline: float,
    say: Say,
    *,
    clock: Callable[[], float] = time.monotonic,
    poll: float = POLL_S,
    wait_name: str = "the launch wait",
) -> None:
    """Waits until every host's sshd answers with the expected key, all hosts at once: a new
    fleet is ready when its slowest machine is, not after the sum of their handshakes.

    A refused key ends the whole wait at once (waiting will not fix it) and is raised as it
    came. At `deadline`, the hosts still waiting are named in one HostsFailed, each with what
    its last attempt said. `wait_name` names the setting that bounds the wait, for the message.
    """
    if not hosts:
        return
    say(f"waiting for SSH on {', '.join(h.name for h in hosts)}")
    stop = threading.Event()
    outcome: dict[str, HostError | None] = {}

    def wait_one(host: Host) -> None:
        while not stop.is_set():
            transport = open_transport(host)
            try:
                transport.connect()
                outcome[host.name] = None
                return
            except HostError as exc:
                outcome[host.name] = exc
                if _refused_key(exc) or clock() >= deadline:
                    if _refused_key(exc):
                        stop.set()
                    return
            finally:
                transport.close()
            stop.wait(min(poll, max(0.0, deadline - clock())))

    try:
        with ThreadPoolExecutor(min(len(hosts), MAX_PARALLEL), "wait-for-ssh") as pool:
            for future in [pool.submit(wait_one, h) for h in hosts]:
                future.result()
    finally:
        stop.set()  # Ctrl-C: the threads leave after their current attempt
    failed = [e for h in hosts if (e := outcome.get(h.name)) is not None]
    for exc in failed:
        if _refused_key(exc):
            raise exc
    if failed:
        raise HostsFailed(
            failed, what=f"SSH did not answer before {wait_name} ran out", outcome=None
        )


def _refused_key(exc: HostError) -> bool:
    return isinstance(exc, HostKeyRefused)


@contextlib.contextmanager
def ended_on_failure(
    end: Callable[[Sequence[str]], None], say: Say | None, noun: str = "machine"
) -> Iterator[list[str]]:
    """Yields the list a launch appends the ids of what it started to; if the block fails
    (Ctrl-C too), ends them: they hold nothing yet and would only cost money. `say`: tell the
    user so (None: the caller's own error says enough)."""
    launched: list[str] = []
    try:
        yield launched
    except BaseException:
        if launched:
            end(list(launched))
            if say is not None:
                say(f"terminated the {plural(len(launched), noun)} this up launched")
        raise


def end_due(
    when: tuple[str, ...],
    groups: Sequence[tuple[str, G]],
    find: Callable[[Sequence[G]], Sequence[Any]],
    end: Callable[[Sequence[Any]], None],
    say: Say,
    *,
    noun: str = "machine",
) -> None:
    """`HostSource.terminate` for a source whose launching groups each say when their machines
    end (`terminate_after`: "down", "job-end", "never"): ends what tfdeploy launched for the
    groups due at `when` (`groups`: (terminate_after, group) pairs; `find`: the machines, as
    ids, launched for some groups; `end`: ends them). Nothing due: not a call to the source."""
    due = [group for after, group in groups if after in when]
    if not due:
        return
    found = list(find(due))
    end(found)
    if found:
        say(f"terminated {plural(len(found), noun)} tfdeploy launched: {', '.join(found)}")
    else:
        say(f"no {noun} that tfdeploy launched for this job is left to terminate")
