"""Preflight's network check: every TCP connection TF will make, tried before anything starts.

A security group or firewall that passes SSH but drops the TF ports lets `up` start every task,
and TensorFlow reports it only after its collective timeout (about 50 s under MWMS, far longer
for a PSS chief waiting on a ps). Here each destination host listens on its TF ports with
stand-ins (remote/netcheck.py), each source host connects to every distinct destination once,
all hosts at once, and a blocked pair fails preflight naming source, destination and verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from deployer.config.plan import Plan, Task
from deployer.config.roles import PS, role
from deployer.core.errors import NetworkBlocked
from deployer.core.text import join_names, plural
from deployer.hosts.fleet import Fleet
from remote import protocol

# A connect that gets no answer is tried twice (remote/netcheck.py), so a dropped SYN costs
# twice this, once, whatever the number of pairs.
PROBE_TIMEOUT_S = 2.5
LISTEN_S = 60.0  # stand-in listeners leave by themselves after this, should `close` never come

T = TypeVar("T")

WHY = {
    protocol.PROBE_TIMED_OUT: "a firewall or security group dropping the TF port?",
    protocol.PROBE_REFUSED: "a firewall rejecting it, or tf_address is not this host's address?",
    protocol.PROBE_NO_ROUTE: (
        "no route to the address: a wrong tf_address, or a firewall rejecting it?"
    ),
}


@dataclass(frozen=True, order=True)
class Link:
    """A TCP connection TF will open: from a task on `source` to `dest`'s TF server."""

    source: str  # host name
    dest: str  # host name
    address: str  # the destination's tf_address
    port: int


def links(plan: Plan) -> list[Link]:
    """The distinct host-to-server connections of the job, by TensorFlow's rules.

    With ps tasks (ParameterServerStrategy, and TF1 `--job_name` scripts) the chief and the
    workers connect to every ps, and the chief to every worker. Without (MultiWorkerMirrored),
    every chief and worker connects to every other. Evaluators connect to nothing.
    """
    with_ps = any(t.role == PS.name for t in plan.tasks)
    by_role: dict[str, list[Task]] = {}
    for task in plan.tasks:
        by_role.setdefault(task.role, []).append(task)
    pairs = [
        (a, b)
        for a in plan.tasks
        for dialled in _dials(a.role, with_ps)
        for b in by_role.get(dialled, [])
        if a is not b
    ]
    return sorted({_link(a, b) for a, b in pairs if b.port is not None})


def _dials(name: str, with_ps: bool) -> tuple[str, ...]:
    r = role(name)
    return r.dials_with_ps if with_ps else r.dials_without_ps


def _link(source: Task, dest: Task) -> Link:
    assert dest.port is not None
    return Link(source.host, dest.host, dest.address, dest.port)


def check(fleet: Fleet, plan: Plan, run_id: str, timeout: float = PROBE_TIMEOUT_S) -> int:
    """Listens on the destinations' ports, probes from every source, closes; returns how many
    connections were tried, or raises NetworkBlocked naming every pair that failed.

    Three parallel rounds (listen, probe, close): one round trip each, plus two `timeout`s
    once when some SYN is dropped.
    """
    wanted = links(plan)
    if not wanted:
        return 0
    ports = _by_host((link.dest, link.port) for link in wanted)
    targets = _by_host((link.source, (link.address, link.port)) for link in wanted)
    listeners = [fleet.member(h) for h in ports]
    try:
        fleet.each(
            lambda m: m.agent.listen(run_id, ports[m.name], LISTEN_S),
            listeners,
            what="the network check could not listen on the TF ports",
        )
        verdicts = fleet.each(
            lambda m: m.agent.probe(run_id, targets[m.name], timeout),
            [fleet.member(h) for h in targets],
            what="the network check failed",
        )
    except BaseException as exc:  # Ctrl-C: close without waiting for the usual slots
        urgent = isinstance(exc, KeyboardInterrupt)
        fleet.each_settled(lambda m: m.agent.unlisten(run_id), listeners, urgent=urgent)
        raise
    fleet.each_settled(lambda m: m.agent.unlisten(run_id), listeners)
    verdict = {
        (host, target): said
        for host, said_all in verdicts.items()
        for target, said in zip(targets[host], said_all, strict=True)
    }
    failed = [(x, verdict[x.source, (x.address, x.port)]) for x in wanted]
    failed = [(x, said) for x, said in failed if said != protocol.PROBE_OK]
    if failed:
        raise blocked(failed, len(wanted))
    return len(wanted)


def _by_host(pairs: Iterable[tuple[str, T]]) -> dict[str, list[T]]:
    grouped: dict[str, list[T]] = {}
    for host, item in pairs:
        if item not in grouped.setdefault(host, []):
            grouped[host].append(item)
    return grouped


def blocked(failed: Sequence[tuple[Link, str]], total: int) -> NetworkBlocked:
    """One line per destination and verdict, sources joined: a host that nobody reaches is one
    line, not one per peer."""
    sources: dict[tuple[str, str, int, str], list[str]] = {}
    for link, verdict in failed:
        sources.setdefault((link.dest, link.address, link.port, verdict), []).append(link.source)
    lines = []
    for (dest, address, port, verdict), names in sorted(sources.items()):
        why = WHY.get(verdict)
        shown = join_names(names) if len(names) <= 4 else f"{names[0]} and {len(names) - 1} more"
        lines.append(
            f"  {shown} -> {dest} ({_host_port(address, port)}): {verdict}"
            + (f" ({why})" if why else "")
        )
    ports = sorted({link.port for link, _ in failed})
    open_ = f"TCP port {ports[0]}" if len(ports) == 1 else f"TCP ports {', '.join(map(str, ports))}"
    return NetworkBlocked(
        f"the network check failed: {plural(len(failed), 'TF connection')} of {total} "
        "cannot be made; nothing was started:\n" + "\n".join(lines),
        hint=f"allow {open_} between the cluster's hosts (security group inbound rules, host "
        "firewall); `--no-netcheck` skips this check",
    )


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
