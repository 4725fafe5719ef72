"""Which TF connections the network check tries: all of them, or a sample above FULL_UP_TO hosts.

TF's connections are one distinct (address, port) per source host and destination server: tasks
sharing a host share the probe. Under MultiWorkerMirrored that is N*(N-1) for N hosts (65,280 at
256), each a stand-in connection a listener must accept within the check. Up to FULL_UP_TO hosts
every one is tried: a host then has at most 31 destinations, two rounds of its probe pool
(protocol.PROBE_WORKERS), so even a host whose every connection is dropped is told within
~10 s. Above, a sample keeps the check's cost near N * PEERS while keeping what finds the usual
faults:

- every connection to a hub (the chief, every ps): every host TF sends there is tried;
- for every other destination role, each source host tries the 1st, 2nd, 4th, 8th, ... host of
  that role after itself in the inventory's order (wrapping around; PEERS of them at least, log2
  of the role's hosts when that is more), so hosts of one subnet listed together still reach into
  every other part of the list; then each destination server gets sources until at least PEERS
  (or all its sources, when fewer) try it.

Hence every listening port is tried from at least min(PEERS, its sources) hosts and every host
tries at least min(PEERS, its destinations) hosts of each role: a port blocked on a host, a host
that cannot reach out, or a cut between two parts of the list is found. What it can miss: a rule
blocking one particular pair (one source address on one port) that the sample does not hold.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deployer.config.model import NetcheckMode
from deployer.config.plan import Plan, Task
from deployer.config.roles import CHIEF, PS, role
from deployer.core.text import join_names

FULL_UP_TO = 32  # hosts; above, `auto` samples (module docstring)
PEERS = 8  # the fewest sources per server, and destination hosts per host and role, when sampled
# Roles every source dials in full in a sample: one chief, a few ps, carrying the whole job.
HUBS = (CHIEF.name, PS.name)


@dataclass(frozen=True, order=True)
class Link:
    """A TCP connection TF will open: from a task on `source` to `dest`'s TF server."""

    source: str  # host name
    dest: str  # host name
    address: str  # the destination's tf_address
    port: int


@dataclass(frozen=True)
class Probes:
    """What the check tries, per source host in the order it probes them (ring order: hosts
    after itself first, so probers do not all start on the same listener)."""

    mode: NetcheckMode  # FULL or SAMPLED, as decided for this plan
    hosts: int  # hosts that dial or are dialled
    needed: int  # distinct connections TF will make
    by_source: Mapping[str, tuple[Link, ...]]
    hubs: tuple[str, ...] = ()  # roles dialled in full (sampled), e.g. ("chief",)

    @property
    def count(self) -> int:
        return sum(len(links) for links in self.by_source.values())

    def links(self) -> list[Link]:
        return sorted(link for links in self.by_source.values() for link in links)

    def summary(self) -> str:
        """The one line that says how much was tried, and how it was chosen."""
        between = f"between {self.hosts:,} host{'' if self.hosts == 1 else 's'} tried"
        if self.mode is not NetcheckMode.SAMPLED:
            return f"network check: {_connections(self.count)} {between} (all)"
        fewest_out, fewest_in = coverage(self.links())
        hubs = [_HUB_WORDS.get(h, f"every {h}") for h in self.hubs]
        dials = join_names([*hubs, f"{fewest_out}+ other hosts"])
        return (
            f"network check: {self.count:,} of {_connections(self.needed)} {between} "
            f"(sampled: each host dials {dials}; each server is dialled from {fewest_in}+ "
            "hosts; --netcheck full tries all)"
        )


_HUB_WORDS = {CHIEF.name: "the chief", PS.name: "every ps"}


def _connections(count: int) -> str:
    return f"{count:,} TF connection{'' if count == 1 else 's'}"


def coverage(links: Iterable[Link]) -> tuple[int, int]:
    """The fewest other hosts a source tries, and the fewest hosts a server is tried from."""
    out: dict[str, set[str]] = {}
    into: dict[tuple[str, int], set[str]] = {}
    for x in links:
        if x.source != x.dest:
            out.setdefault(x.source, set()).add(x.dest)
            into.setdefault((x.address, x.port), set()).add(x.source)
    return min(map(len, out.values()), default=0), min(map(len, into.values()), default=0)


def links(plan: Plan) -> list[Link]:
    """Every distinct host-to-server connection of the job, by TensorFlow's rules.

    With ps tasks (ParameterServerStrategy, and TF1 `--job_name` scripts) the chief and the
    workers connect to every ps, and the chief to every worker. Without (MultiWorkerMirrored),
    every chief and worker connects to every other. Evaluators connect to nothing.
    """
    return choose(plan, NetcheckMode.FULL).links()


def choose(plan: Plan, mode: NetcheckMode, *, full_up_to: int = FULL_UP_TO) -> Probes:
    """The probes for `mode` (AUTO: full up to `full_up_to` hosts). Deterministic: the same
    plan gives the same probes, so a failure seen once is seen again."""
    graph = _Graph(plan)
    sampled = mode is NetcheckMode.SAMPLED or (
        mode is NetcheckMode.AUTO and graph.hosts > full_up_to
    )
    chosen: dict[str, set[Link]] = {}
    for dialled in graph.dialers:
        if sampled and dialled not in HUBS:
            graph.sample(dialled, chosen)
        else:
            graph.every(dialled, chosen)
    order = graph.order
    by_source = {
        source: tuple(
            sorted(
                found,
                key=lambda x: ((order[x.dest] - order[x.source]) % len(order), x.port, x.address),
            )
        )
        for source, found in sorted(chosen.items(), key=lambda item: order[item[0]])
    }
    needed = graph.needed()
    sampled = sampled and sum(map(len, by_source.values())) < needed  # else it is all of them
    hubs = tuple(h for h in HUBS if h in graph.dialers) if sampled else ()
    return Probes(
        mode=NetcheckMode.SAMPLED if sampled else NetcheckMode.FULL,
        hosts=graph.hosts,
        needed=needed,
        by_source=by_source,
        hubs=hubs,
    )


class _Graph:
    """Who dials what, by role and host, without listing the N*N pairs (a sample must not cost
    what the full check costs)."""

    def __init__(self, plan: Plan) -> None:
        self.order = {h.name: i for i, h in enumerate(plan.hosts)}
        with_ps = any(t.role == PS.name for t in plan.tasks)
        # role -> host -> its tasks of that role with a TF port (the servers)
        self.servers: dict[str, dict[str, list[Task]]] = {}
        # dialled role -> host -> its tasks that dial that role
        self.dialers: dict[str, dict[str, list[Task]]] = {}
        for task in sorted(plan.tasks, key=lambda t: self.order[t.host]):
            if task.port is not None:
                self.servers.setdefault(task.role, {}).setdefault(task.host, []).append(task)
            r = role(task.role)
            for dialled in r.dials_with_ps if with_ps else r.dials_without_ps:
                self.dialers.setdefault(dialled, {}).setdefault(task.host, []).append(task)
        self.dialers = {r: d for r, d in self.dialers.items() if r in self.servers}
        involved = {h for by_host in self.dialers.values() for h in by_host}
        involved |= {h for r in self.dialers for h in self.servers[r]}
        self.hosts = len(involved)

    def _dials(self, dialled: str, source: str, server: Task) -> bool:
        """Some task on `source` other than `server` itself dials it."""
        return any(t is not server for t in self.dialers[dialled][source])

    def _add(self, chosen: dict[str, set[Link]], dialled: str, source: str, dest: str) -> None:
        for server in self.servers[dialled][dest]:
            if self._dials(dialled, source, server):
                assert server.port is not None
                link = Link(source, dest, server.address, server.port)
                chosen.setdefault(source, set()).add(link)

    def every(self, dialled: str, chosen: dict[str, set[Link]]) -> None:
        for source in self.dialers[dialled]:
            for dest in self.servers[dialled]:
                self._add(chosen, dialled, source, dest)

    def needed(self) -> int:
        """How many connections `every` would list, counted without listing them."""
        total = 0
        for dialled, by_host in self.dialers.items():
            servers = sum(map(len, self.servers[dialled].values()))
            for tasks in by_host.values():
                # a host's only dialler of a role does not dial itself
                alone = len(tasks) == 1 and tasks[0].role == dialled and tasks[0].port is not None
                total += servers - alone
        return total

    def sample(self, dialled: str, chosen: dict[str, set[Link]]) -> None:
        """Ring fingers from every source, then sources added until each server has PEERS."""
        dests = list(self.servers[dialled])  # in inventory order, like `sources`
        sources = list(self.dialers[dialled])
        dest_at = [self.order[h] for h in dests]
        tried_from: dict[str, set[str]] = {h: set() for h in dests}
        for source in sources:
            if source in tried_from:  # its own other servers: free to try, and needed
                self._add(chosen, dialled, source, source)
            others = len(dests) - (source in tried_from)
            after = bisect_right(dest_at, self.order[source])  # the first dest host after it
            for rank in _ranks(others):
                dest = dests[(after + rank - 1) % len(dests)]
                self._add(chosen, dialled, source, dest)
                tried_from[dest].add(source)
        source_at = [self.order[h] for h in sources]
        for dest, tried in tried_from.items():
            want = min(PEERS, len(sources) - (dest in self.dialers[dialled]))
            before = bisect_left(source_at, self.order[dest])  # sources[before - 1] precedes it
            step = 1
            while len(tried) < want:
                source = sources[(before - step) % len(sources)]
                step += 1
                if source != dest and source not in tried:
                    self._add(chosen, dialled, source, dest)
                    tried.add(source)


@functools.cache
def _ranks(others: int) -> tuple[int, ...]:
    """Which of the `others` hosts after a source it tries (1 is the next one): powers of two,
    so the jumps reach every part of the list, then the nearest others up to PEERS."""
    ranks = []
    step = 1
    while step <= others:
        ranks.append(step)
        step *= 2
    fill = (r for r in range(3, others + 1) if r not in ranks)
    while len(ranks) < min(PEERS, others):
        ranks.append(next(fill))
    return tuple(sorted(ranks))
