"""The push's fan-out: the controller's uplink carries each missing content once, and the hosts
relay it along a chain, piece by piece.

A star push (every byte from the controller to every host) is bounded by the controller's
uplink times the number of hosts: a laptop deploying to 16 cloud GPUs sends everything 16
times. Here the controller streams the contents once, to the first host of a chain; every host
stores each piece as it arrives and passes it on to the next at once (remote/peers.py). The
contents flow while the chain fills, so the last host is done about one uplink transfer plus a
few pieces' time after the first byte left: no round waits for whole files. The controller only
sets the chain up and reads its outcome.

The uplink's one copy goes into the chain's first host, the seed, on a session of its own, once
every listener is up: the seed forwards each piece to the next host as it stores it.

What fails falls back, never the deploy: a host whose copy broke (it, or a host before it,
died or stalled mid-stream; a security group between two hosts) is left to the star push that
follows, which sends it what it still lacks, and the output says so. Relay streams are
authenticated with a per-run secret and every host checks every content by sha256; the
listeners bind the hosts' cluster addresses on a TF port of the run (free until the tasks
start, and open between the hosts, as the network check proved) and are stopped before the
push returns.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.config.plan import Plan
from deployer.core.errors import HostError
from deployer.core.text import human_size, plural
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.replies import Edge, text
from deployer.push.sync import ByteMeter, CodeFile, Manifest, send_contents
from remote import protocol

MIN_BYTES = 1 << 20  # less than this to send: a star push costs less than setting up a chain
LISTEN_S = 600.0  # a listener's own deadline, should the controller vanish mid-push


@dataclass
class Spread:
    """What a fan-out did, for the summary `up` prints."""

    seed: str
    uplink_bytes: int  # what the controller sent (to the seed)
    copied: dict[str, int] = field(default_factory=dict)  # host -> bytes relayed to it
    fallback: dict[str, str] = field(default_factory=dict)  # host -> why the star serves it

    def lines(self) -> list[str]:
        said = [
            f"fan-out: {human_size(self.uplink_bytes)} sent to {self.seed}, relayed host to host "
            f"to {plural(len(self.copied), 'host')}"
        ]
        said += [
            f"{host}: {why}; it gets the code from here" for host, why in self.fallback.items()
        ]
        return said


def spread(
    fleet: Fleet,
    members: Sequence[Member],
    plan: Plan,
    manifest: Manifest,
    run_id: str,
    missing: Mapping[str, Sequence[str]],
    meter: ByteMeter | None = None,
) -> Spread | None:
    """Fills the members' stores with what they lack (`missing`: each member's answer to
    `have`) along a relay chain; None when a star push is the better deal (one host, little to
    send, fewer than two hosts able to listen). `meter`: told the bytes this machine streams
    into the seed as they go (the push's progress counts what travels)."""
    by_hash = manifest.by_hash()
    ports = {m.name: p for m in members if (p := serving_port(plan, m.name)) is not None}
    chain = [m for m in members if missing[m.name] and m.name in ports]
    contents = [by_hash[s] for s in sorted({s for m in chain for s in missing[m.name]})]
    if len(chain) < 2 or sum(f.size for f in contents) < MIN_BYTES:
        return None
    relay = _Chain(fleet, run_id, chain, ports, missing)
    try:
        relay.listen()
        if len(relay.hosts) < 2:
            return None  # no host after the first can listen: the star push does it all
        outcomes = relay.stream(manifest, contents, meter)
    finally:
        relay.close()
    sent = sum(f.size for f in contents)
    result = Spread(seed=relay.hosts[0].name, uplink_bytes=sent)
    for member, error in zip(relay.hosts[1:], outcomes[1:], strict=True):
        if error:
            result.fallback[member.name] = f"could not get the code along the chain ({error})"
        else:
            result.copied[member.name] = sum(by_hash[s].size for s in missing[member.name])
    return result


class _Chain:
    """The hosts of one fan-out in chain order, their listeners, and the stream through them."""

    def __init__(
        self,
        fleet: Fleet,
        run_id: str,
        hosts: Sequence[Member],
        ports: dict[str, int],
        missing: Mapping[str, Sequence[str]],
    ) -> None:
        self.fleet, self.run_id, self.ports = fleet, run_id, ports
        # What each host stores of the stream: what it lacks of its own needs. The rest (other
        # hosts' wheels, another platform's) it checks and passes on, never writes.
        self.store = {name: sorted(lack) for name, lack in missing.items()}
        self.hosts = list(hosts)
        # The run's secret, which the seed proves to the next host: in requests over SSH only,
        # never argv, never a log.
        self.secret = secrets.token_hex(32)
        self.listening: list[Member] = []  # asked to listen: every one is told to stop

    def _hop(self, member: Member) -> tuple[str, int]:
        return member.host.tf_address, self.ports[member.name]

    def listen(self) -> None:
        """Every host but the first listens, pointed at the one after it; a host that cannot
        listen (its port taken meanwhile) leaves the chain and is linked around, once."""
        for _attempt in range(2):
            later = self.hosts[1:]
            self.listening = list(later)
            _, failed = self.fleet.each_settled(self._listen, later)
            if not failed:
                return
            gone = {f.host for f in failed}
            self._close(later)
            self.hosts = [m for m in self.hosts if m.name not in gone]
        self.hosts = self.hosts[:1]  # still failing: no chain at all

    def _listen(self, member: Member) -> None:
        position = self.hosts.index(member)
        then = self._hop(self.hosts[position + 1]) if position + 1 < len(self.hosts) else None
        address, port = self._hop(member)
        member.agent.relay(
            self.run_id, address, port, self.secret, then, LISTEN_S, self.store[member.name]
        )

    def stream(
        self, manifest: Manifest, contents: Sequence[CodeFile], meter: ByteMeter | None = None
    ) -> list[str]:
        """Streams the contents into the first host, relayed along the chain; each host's
        error ("" when it stored everything), in chain order. A first host that fails takes
        the chain with it: every host then gets the star push."""
        first, hop = self.hosts[0], self._hop(self.hosts[1])
        on_piece = None
        if meter is not None:
            meter.expect(first.name, sum(f.size for f in contents))
            on_piece = functools.partial(meter.add, first.name)

        def seed(member: Member) -> dict[str, Any]:
            # A session of its own: the stream holds it as long as it needs. On the fleet's
            # threads, so Ctrl-C drops the connection it is busy on (Fleet.interrupt).
            with member.agent.dedicated() as own:
                return send_contents(
                    own,
                    manifest,
                    contents,
                    protocol.OP_PEERS,
                    on_piece=on_piece,
                    action=protocol.PEERS_SEED,
                    run_id=self.run_id,
                    secret=self.secret,
                    next=list(hop),
                    store=self.store[member.name],
                )

        replies, failed = self.fleet.each_settled(seed, [first])
        if failed:
            return [failed[0].cause] * len(self.hosts)
        try:
            edge = Edge(first.name, protocol.OP_PEERS)
            chain = edge.reply(replies[first.name], protocol.ChainReply)["chain"]
        except HostError as exc:
            return [exc.cause] * len(self.hosts)
        # The hosts' own words, printed where the push falls back: cleaned (replies.text).
        errors = [text(entry["error"]) for entry in chain]
        errors += ["the stream did not reach it"] * (len(self.hosts) - len(errors))
        return errors[: len(self.hosts)]

    def close(self) -> None:
        self._close(self.listening)

    def _close(self, members: Sequence[Member]) -> None:
        # urgent: fresh threads, also after Ctrl-C abandoned the calls holding the slots
        self.fleet.each_settled(lambda m: m.agent.stop_serving(self.run_id), members, urgent=True)


def serving_port(plan: Plan, host: str) -> int | None:
    """A TF port of the run on `host`: reserved for it, free until its task starts, and one the
    network check proved open between the hosts."""
    ports = [t.port for t in plan.tasks_on(host) if t.port is not None]
    return min(ports) if ports else None
