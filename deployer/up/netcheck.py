"""Preflight's network check: every TCP connection TF will make, tried before anything starts.

A security group or firewall that passes SSH but drops the TF ports lets `up` start every task,
and TensorFlow reports it only after its collective timeout (about 50 s under MWMS, far longer
for a PSS chief waiting on a ps). Here each destination host listens on its TF ports with
stand-ins (remote/netcheck.py), each source host connects to each distinct destination it is to
try once (all of them, or a sample on large fleets: netplan.py), all hosts at once, and a blocked
pair fails preflight naming source, destination and verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from deployer.config.model import NetcheckMode
from deployer.config.plan import Plan
from deployer.core.errors import NetworkBlocked
from deployer.core.text import join_names, plural
from deployer.hosts.fleet import Fleet
from deployer.up.netplan import Link, Probes, choose
from remote import protocol

# Each connect's own limit, from the moment it starts (not while it waits in the host's probe
# pool); one that gets no answer is tried once more (remote/netcheck.py). 2.5 s covers the
# kernel's first SYN retransmission (after 1 s).
PROBE_TIMEOUT_S = 2.5
# Stand-in listeners leave by themselves after the probes' budget plus this, should `close`
# never come.
LISTEN_S = 60.0

T = TypeVar("T")

WHY = {
    protocol.PROBE_TIMED_OUT: "a firewall or security group dropping the TF port?",
    protocol.PROBE_REFUSED: "a firewall rejecting it, or tf_address is not this host's address?",
    protocol.PROBE_NO_ROUTE: (
        "no route to the address: a wrong tf_address, or a firewall rejecting it?"
    ),
    protocol.PROBE_UNRESOLVED: (
        "the source host cannot resolve this name: is it in DNS, or only this machine's "
        "ssh_config or /etc/hosts?"
    ),
}
# An unresolved name is no firewall's doing: the hint says what to set instead.
DNS_HINT = (
    "set tf_address to an IP address or a name every host resolves (an ssh_config alias is "
    "known only to this machine)"
)


@dataclass(frozen=True)
class Listen:
    """What one host listens on for its peers' probes, and for how long at most."""

    ports: tuple[int, ...]
    seconds: float


def listeners(
    plan: Plan, mode: NetcheckMode = NetcheckMode.AUTO, timeout: float = PROBE_TIMEOUT_S
) -> dict[str, Listen]:
    """Per destination host, the stand-ins `check` needs. Preflight's hello starts them
    (one round trip less); `check` starts those a hello did not."""
    probes = choose(plan, mode)
    return _listens(probes, timeout) if probes.count else {}


def _listens(probes: Probes, timeout: float) -> dict[str, Listen]:
    ports = _by_host((link.dest, link.port) for link in probes.links())
    longest = max(map(len, probes.by_source.values()))
    seconds = max(LISTEN_S, protocol.probe_budget(longest, timeout) + LISTEN_S)
    return {host: Listen(tuple(found), seconds) for host, found in ports.items()}


def check(
    fleet: Fleet,
    plan: Plan,
    run_id: str,
    mode: NetcheckMode = NetcheckMode.AUTO,
    timeout: float = PROBE_TIMEOUT_S,
    listening: Mapping[str, Listen] | None = None,
    close: bool = True,
) -> Probes | None:
    """Listens on the destinations' ports, probes from every source, closes; returns what was
    tried (None: nothing to try), or raises NetworkBlocked naming every pair that failed.

    Three parallel rounds (listen, probe, close): one round trip each, two where preflight's
    hellos already listen (`listening`: what each started), one where the caller's next
    request stops the stand-ins anyway (`close=False`: `check` releases the run, and release
    stops them; a failed check closes them here). Each host probes its destinations
    a pool at a time (remote/netcheck.py), so the probe round takes at most
    protocol.probe_budget for the longest list, and the stand-ins listen that long.
    """
    probes = choose(plan, mode)
    if not probes.count:
        return None
    wanted = probes.links()
    targets = {
        source: [(link.address, link.port) for link in found]
        for source, found in probes.by_source.items()
    }
    needed = _listens(probes, timeout)
    started = listening or {}
    stand_ins = [fleet.member(h) for h in needed]
    try:
        fleet.each(
            lambda m: m.agent.listen(run_id, needed[m.name].ports, needed[m.name].seconds),
            [m for m in stand_ins if started.get(m.name) != needed[m.name]],
            what="the network check could not listen on the TF ports",
        )
        verdicts = fleet.each(
            lambda m: m.agent.probe(run_id, targets[m.name], timeout),
            [fleet.member(h) for h in targets],
            what="the network check failed",
        )
    except BaseException as exc:  # Ctrl-C: close without waiting for the usual slots
        urgent = isinstance(exc, KeyboardInterrupt)
        fleet.each_settled(lambda m: m.agent.unlisten(run_id), stand_ins, urgent=urgent)
        raise
    if close:
        fleet.each_settled(lambda m: m.agent.unlisten(run_id), stand_ins)
    verdict = {
        (host, target): said
        for host, said_all in verdicts.items()
        for target, said in zip(targets[host], said_all, strict=True)
    }
    failed = [(x, verdict[x.source, (x.address, x.port)]) for x in wanted]
    failed = [(x, said) for x, said in failed if said != protocol.PROBE_OK]
    if failed:
        raise blocked(failed, len(wanted), sampled=probes.mode is NetcheckMode.SAMPLED)
    return probes


def _by_host(pairs: Iterable[tuple[str, T]]) -> dict[str, list[T]]:
    grouped: dict[str, list[T]] = {}
    for host, item in pairs:
        if item not in grouped.setdefault(host, []):
            grouped[host].append(item)
    return grouped


def blocked(
    failed: Sequence[tuple[Link, str]], total: int, *, sampled: bool = False
) -> NetworkBlocked:
    """One line per destination and verdict, sources joined: a host that nobody reaches is one
    line, not one per peer."""
    sources: dict[tuple[str, str, int, str], list[str]] = {}
    for link, verdict in failed:
        sources.setdefault((link.dest, link.address, link.port, verdict), []).append(link.source)
    lines = []
    for (dest, address, port, verdict), names in sorted(sources.items()):
        why = WHY.get(verdict.partition(":")[0])  # "unresolved: <why>" carries the host's reason
        shown = join_names(names) if len(names) <= 4 else f"{names[0]} and {len(names) - 1} more"
        lines.append(
            f"  {shown} -> {dest} ({_host_port(address, port)}): {verdict}"
            + (f" ({why})" if why else "")
        )
    tried = f"{total:,} tried (a sample: others may fail too)" if sampled else f"{total:,}"
    return NetworkBlocked(
        f"the network check failed: {plural(len(failed), 'TF connection')} of {tried} "
        "cannot be made; nothing was started:\n" + "\n".join(lines),
        hint=_hint(failed)
        + "; `--no-netcheck` skips this check"
        + ("; `--netcheck full` tries every connection" if sampled else ""),
    )


def _hint(failed: Sequence[tuple[Link, str]]) -> str:
    """What to fix: a name the hosts cannot resolve first (no firewall rule helps it), then
    the ports to open for the connections that did reach an address."""
    unresolved = [v for _, v in failed if v.startswith(protocol.PROBE_UNRESOLVED)]
    ports = sorted({link.port for link, v in failed if not v.startswith(protocol.PROBE_UNRESOLVED)})
    said = [DNS_HINT] if unresolved else []
    if ports:
        open_ = (
            f"TCP port {ports[0]}" if len(ports) == 1 else f"TCP ports {', '.join(map(str, ports))}"
        )
        said.append(
            f"allow {open_} between the cluster's hosts (security group inbound rules, host "
            "firewall)"
        )
    return "; ".join(said)


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
