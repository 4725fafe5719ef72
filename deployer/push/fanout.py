"""The push's fan-out: the controller's uplink carries each missing content once, hosts copy
the rest to each other.

A star push (every byte from the controller to every host) is bounded by the controller's
uplink times the number of hosts: a laptop deploying to 16 cloud GPUs sends everything 16
times. Here the controller fills one host (the seed); then, round by round, every host that
holds the whole tree serves it to one that does not, over the cluster's own addresses, so the
holders double each round (log2 N rounds). The controller only directs.

What fails falls back, never the deploy: a host that could not copy from its peers twice (a
peer died or stalled, a security group between hosts) is left to the star push that follows,
which sends it what it still lacks, and the output says so. Peer transfers are authenticated
with a per-run secret and checked by sha256 on arrival (remote/peers.py); the servers bind the
hosts' cluster addresses on a TF port of the run (free until the tasks start, and open between
the hosts, as the network check proved) and are stopped before the push returns.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.config.plan import Plan
from deployer.core.errors import HostError
from deployer.core.text import plural
from deployer.hosts.agent import PeerFetch
from deployer.hosts.fleet import Fleet, Member
from deployer.push.sync import MIN_RATE, Manifest, store_contents

MIN_BYTES = 1 << 20  # less than this to send: a star push costs less than the rounds
SERVE_S = 600.0  # a server's own deadline, should the controller vanish mid-push
TRIES = 2  # failed copies before a host is left to the star push


@dataclass
class Spread:
    """What a fan-out did, for the summary `up` prints."""

    seed: str
    uplink_bytes: int  # what the controller sent (to the seed)
    copied: dict[str, int] = field(default_factory=dict)  # host -> bytes from its peers
    rounds: int = 0
    fallback: dict[str, str] = field(default_factory=dict)  # host -> why the star serves it

    def lines(self) -> list[str]:
        said = [
            f"fan-out: {self.uplink_bytes} bytes sent to {self.seed}, copied host to host to "
            f"{plural(len(self.copied), 'host')} in {plural(self.rounds, 'round')}"
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
    run_fields: dict[str, Any],
) -> Spread | None:
    """Fills the members' stores with what they lack, host to host; None when a star push is
    the better deal (one host, little to send, no host able to serve)."""
    by_hash = manifest.by_hash()
    missing = fleet.each(
        lambda m: m.agent.missing(sorted(by_hash)), members, what="pushing the code failed"
    )
    needy = [m for m in members if missing[m.name]]
    wanted = {sha for m in needy for sha in missing[m.name]}
    ports = {m.name: p for m in members if (p := _serving_port(plan, m.name)) is not None}
    servable = [m for m in members if m.name in ports]
    if len(needy) < 2 or sum(by_hash[s].size for s in wanted) < MIN_BYTES or not servable:
        return None
    seed = min(servable, key=lambda m: sum(by_hash[s].size for s in missing[m.name]))
    secret = secrets.token_hex(32)  # in requests over SSH only: never argv, never a log
    run = _Round(fleet, run_id, secret, ports, by_hash)
    try:
        store_contents(seed.agent, manifest, [by_hash[s] for s in missing[seed.name]], run_fields)
        sent = sum(by_hash[s].size for s in missing[seed.name])
        result = Spread(seed=seed.name, uplink_bytes=sent)
        run.serve(seed)
        if not run.holders:
            return None  # the seed cannot serve: the star push does it all
        waiting = [m for m in needy if m is not seed]
        tries = dict.fromkeys((m.name for m in waiting), 0)
        while waiting:
            result.rounds += 1
            fetchers = waiting[: len(run.holders)]
            done, failed = fleet.each_settled(
                functools.partial(run.fetch, order=fetchers, missing=missing), fetchers
            )
            for m in fetchers:
                reply = done.get(m.name)
                if reply is not None and not reply.missing:
                    waiting.remove(m)
                    result.copied[m.name] = reply.bytes
                    run.serve(m)
                    continue
                tries[m.name] += 1
                if reply is not None:
                    missing[m.name] = list(reply.missing)
                if tries[m.name] >= TRIES:
                    waiting.remove(m)
                    result.fallback[m.name] = _why(reply, failed, m.name)
        return result
    finally:
        run.close()


class _Round:
    """The servers of one fan-out: who holds the whole tree and serves it, and where."""

    def __init__(
        self, fleet: Fleet, run_id: str, secret: str, ports: dict[str, int], by_hash: dict[str, Any]
    ) -> None:
        self.fleet, self.run_id, self.secret = fleet, run_id, secret
        self.ports, self.by_hash = ports, by_hash
        self.holders: list[Member] = []
        self.started: list[Member] = []  # asked to serve: every one is told to stop at the end

    def serve(self, member: Member) -> None:
        if member.name not in self.ports:
            return  # it has no TF port to serve on (an evaluator-only host): a fetcher only
        self.started.append(member)
        address, port = member.host.tf_address, self.ports[member.name]
        try:
            member.agent.serve_store(self.run_id, address, port, self.secret, SERVE_S)
        except HostError:
            return  # a host that cannot serve (its port taken meanwhile) is simply not a source
        self.holders.append(member)

    def fetch(
        self, member: Member, *, order: Sequence[Member], missing: dict[str, list[str]]
    ) -> PeerFetch:
        """The n-th fetcher of a round asks the n-th holder first (each holder serves one host
        per round), then the others."""
        wanted = missing[member.name]
        first = list(order).index(member) % len(self.holders)
        holders = self.holders[first:] + self.holders[:first]
        peers = [(h.host.tf_address, self.ports[h.name]) for h in holders if h is not member]
        blobs = [(sha, self.by_hash[sha].size) for sha in wanted]
        timeout = 60 + sum(size for _, size in blobs) / MIN_RATE
        return member.agent.fetch_from_peers(self.run_id, blobs, peers, self.secret, timeout)

    def close(self) -> None:
        # urgent: fresh threads, also after Ctrl-C abandoned the fetches holding the slots
        self.fleet.each_settled(
            lambda m: m.agent.stop_serving(self.run_id), self.started, urgent=True
        )


def _serving_port(plan: Plan, host: str) -> int | None:
    """A TF port of the run on `host`: reserved for it, free until its task starts, and one the
    network check proved open between the hosts."""
    ports = [t.port for t in plan.tasks_on(host) if t.port is not None]
    return min(ports) if ports else None


def _why(reply: PeerFetch | None, failed: Sequence[HostError], host: str) -> str:
    if reply is not None:
        errors = "; ".join(reply.errors) or "they lacked some contents"
        return f"could not copy from its peers ({errors})"
    cause = next((f.cause for f in failed if f.host == host), "no answer")
    return f"could not copy from its peers ({cause})"
