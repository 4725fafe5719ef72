"""`firewall = true`: while a run is up, its TF ports accept only the cluster's own addresses.

TensorFlow's gRPC servers bind every interface and authenticate no one; the hosts' agents add
nftables (or iptables) rules tagged with the run id before any task starts and remove them at
teardown. The rules live in remote/firewall.py; this module decides what each host gets.
"""

from __future__ import annotations

from collections.abc import Iterable

from deployer.config.plan import Plan
from deployer.core.errors import HostError
from deployer.hosts.fleet import Fleet, Member


def allowed_addresses(plan: Plan) -> list[str]:
    """Every host's tf_address: the only peers TF traffic is expected from."""
    return sorted({h.tf_address for h in plan.hosts})


def ports_on(plan: Plan, host: str) -> list[int]:
    return sorted({t.port for t in plan.tasks_on(host) if t.port is not None})


def check(fleet: Fleet, members: Iterable[Member]) -> list[HostError]:
    """Preflight: one HostError per host that lacks nft/iptables or the privilege to use it."""

    results, failures = fleet.each_settled(lambda m: m.agent.firewall_problem(), members)
    problems = [
        HostError(
            name,
            f"firewall = true, but {problem}",
            hint="the firewall option needs nft or iptables and root (or passwordless sudo) "
            "on every host; without it, restrict the TF ports with security groups",
        )
        for name, problem in results.items()
        if problem
    ]
    return failures + problems


def add(fleet: Fleet, members: Iterable[Member], plan: Plan, run_id: str) -> list[str]:
    """Installs the run's rules on every member; raises HostsFailed naming the hosts that failed.

    Returns the hosts that got rules, which teardown must clean (also the ones that failed: a
    partial add is cleaned too).
    """
    members = list(members)
    allowed = allowed_addresses(plan)

    def add_on(member: Member) -> None:
        member.agent.firewall_add(run_id, ports_on(plan, member.name), allowed)

    fleet.each(add_on, members, what="installing the TF port firewall failed")
    return [m.name for m in members]


def remove(fleet: Fleet, members: Iterable[Member], run_id: str) -> list[HostError]:
    """Removes the run's rules wherever they are; idempotent; returns the hosts it failed on."""
    _, failures = fleet.each_settled(lambda m: m.agent.firewall_remove(run_id), members)
    return failures
