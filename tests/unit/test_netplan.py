"""Which connections the network check tries: all of them, or a sample on large fleets that keeps
its coverage guarantees (every server tried from PEERS hosts, every host trying PEERS hosts per
role, every chief and ps connection), deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.config.model import NetcheckMode
from deployer.config.plan import Plan
from deployer.core.errors import InventoryError
from deployer.up.netplan import FULL_UP_TO, HUBS, PEERS, Link, choose, links
from tests.support.helpers import JOB, plan

Roles = Callable[[int], list[str]]


def fleet(tmp_path: Path, n: int, roles: Roles, *, netcheck: str = "") -> Plan:
    """n hosts h1..hn on 10.1.X.Y; host i runs the tasks `roles(i)` names."""
    text = JOB + netcheck
    for i in range(n):
        tasks = ", ".join(f'{{ role = "{r}" }}' for r in roles(i))
        text += (
            f'\n[[hosts]]\nname = "h{i + 1}"\naddress = "10.1.{i // 200}.{i % 200 + 1}"\n'
            f"tasks = [{tasks}]\n"
        )
    return plan(tmp_path, text)


def workers(i: int) -> list[str]:
    return ["worker"]


def chief_and_workers(i: int) -> list[str]:
    return ["chief"] if i == 0 else ["worker"]


def pss(i: int) -> list[str]:
    return ["chief"] if i == 0 else ["ps"] if i <= 4 else ["worker"]


def two_workers_each(i: int) -> list[str]:
    return ["worker", "worker"]


def mixed(i: int) -> list[str]:
    """A chief host with a worker too, an evaluator, hosts of one and of two workers."""
    first = [["chief", "worker"], ["evaluator"], ["worker", "worker"]]
    return first[i] if i < len(first) else ["worker"] * (1 + i % 2)


SHAPES = [
    (33, workers),
    (40, chief_and_workers),
    (64, two_workers_each),
    (100, pss),
    (70, mixed),
    (256, chief_and_workers),
]


@pytest.mark.parametrize(("n", "roles"), SHAPES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_sample_keeps_its_guarantees(tmp_path: Path, n: int, roles: Roles) -> None:
    p = fleet(tmp_path, n, roles)
    full = set(links(p))
    probes = choose(p, NetcheckMode.AUTO)
    sample = set(probes.links())
    assert sample <= full  # never a connection TF does not make
    assert probes.needed == len(full)
    role_of = {(t.address, t.port): t.role for t in p.tasks if t.port is not None}
    # every chief and ps connection, in full
    assert {x for x in full if role_of[x.address, x.port] in HUBS} <= sample
    # every server is tried from PEERS hosts, or from every host that dials it when fewer
    could, did = _sources(full), _sources(sample)
    for server, sources in could.items():
        assert len(did[server]) >= min(PEERS, len(sources)), server
    # every host tries PEERS other hosts of each role it dials, or every one when fewer
    reachable, tried = _dests(full, role_of), _dests(sample, role_of)
    for source_and_role, dests in reachable.items():
        assert len(tried[source_and_role]) >= min(PEERS, len(dests)), source_and_role
    # deterministic: the same plan, planned again, gives the same probes in the same order
    again = choose(fleet(tmp_path, n, roles), NetcheckMode.AUTO)
    assert again.by_source == probes.by_source


def _sources(found: set[Link]) -> dict[tuple[str, int], set[str]]:
    """Per server, the other hosts that try it."""
    by_server: dict[tuple[str, int], set[str]] = {}
    for x in found:
        by_server.setdefault((x.address, x.port), set())
        if x.source != x.dest:
            by_server[x.address, x.port].add(x.source)
    return by_server


def _dests(
    found: set[Link], role_of: dict[tuple[str, int], str]
) -> dict[tuple[str, str], set[str]]:
    """Per source host and role dialled, the other hosts it tries."""
    by_source: dict[tuple[str, str], set[str]] = {}
    for x in found:
        key = (x.source, role_of[x.address, x.port])
        by_source.setdefault(key, set())
        if x.source != x.dest:
            by_source[key].add(x.dest)
    return by_source


def test_a_sample_stays_near_peers_per_host(tmp_path: Path) -> None:
    p = fleet(tmp_path, 256, workers)
    probes = choose(p, NetcheckMode.AUTO)
    assert probes.mode is NetcheckMode.SAMPLED and probes.needed == 256 * 255
    assert probes.count == 256 * 8  # 1, 2, 4, ..., 128 hosts after each
    assert {len(found) for found in probes.by_source.values()} == {8}
    first = {found[0].dest for found in probes.by_source.values()}
    assert len(first) == 256  # each host starts with the next one: no herd on one listener


@pytest.mark.parametrize("block", [8, 32, 64])
def test_hosts_listed_by_subnet_all_reach_the_other_subnets(tmp_path: Path, block: int) -> None:
    """A security group between subnets blocks everything across: the sample must cross from
    every host, wherever the subnets' hosts sit in the list (here: runs of `block` hosts)."""
    p = fleet(tmp_path, 128, workers)
    subnet = {f"h{i + 1}": i // block for i in range(128)}
    sample = choose(p, NetcheckMode.SAMPLED).links()
    for source in subnet:
        assert any(subnet[x.dest] != subnet[source] for x in sample if x.source == source)
        assert any(subnet[x.source] != subnet[source] for x in sample if x.dest == source)


def test_auto_tries_everything_up_to_the_threshold(tmp_path: Path) -> None:
    small = fleet(tmp_path, FULL_UP_TO, workers)
    assert choose(small, NetcheckMode.AUTO).mode is NetcheckMode.FULL
    assert choose(small, NetcheckMode.AUTO).count == FULL_UP_TO * (FULL_UP_TO - 1)
    assert choose(small, NetcheckMode.SAMPLED).mode is NetcheckMode.SAMPLED
    large = fleet(tmp_path, FULL_UP_TO + 1, workers)
    assert choose(large, NetcheckMode.AUTO).mode is NetcheckMode.SAMPLED
    assert choose(large, NetcheckMode.FULL).count == (FULL_UP_TO + 1) * FULL_UP_TO
    assert choose(large, NetcheckMode.AUTO, full_up_to=64).mode is NetcheckMode.FULL


def test_a_sample_that_is_everything_says_all(tmp_path: Path) -> None:
    """PSS with few ps: workers dial only the ps, the chief every worker; nothing to leave out."""
    probes = choose(fleet(tmp_path, 100, pss), NetcheckMode.AUTO)
    assert probes.mode is NetcheckMode.FULL and probes.count == probes.needed
    assert probes.summary() == (
        f"network check: {probes.count:,} TF connections between 100 hosts tried (all)"
    )


def test_tasks_sharing_a_host_share_one_probe_per_destination(tmp_path: Path) -> None:
    p = fleet(tmp_path, 3, lambda i: ["worker"] * 4)
    probes = choose(p, NetcheckMode.FULL)
    found = probes.by_source["h1"]
    assert len(found) == len(set(found)) == 4 * 2 + 4  # 4 ports on h2 and h3, 4 of its own
    assert found[0].dest == "h1" and found[-1].dest == "h3"  # its own first, then ring order
    assert sum(1 for x in found if x.dest == "h2") == 4


def test_the_summary_says_how_the_sample_was_made(tmp_path: Path) -> None:
    probes = choose(fleet(tmp_path, 256, chief_and_workers), NetcheckMode.AUTO)
    assert probes.summary() == (
        "network check: 2,303 of 65,280 TF connections between 256 hosts tried (sampled: each "
        "host dials the chief and 8+ other hosts; each server is dialled from 8+ hosts; "
        "--netcheck full tries all)"
    )
    assert choose(fleet(tmp_path, 2, workers), NetcheckMode.AUTO).summary() == (
        "network check: 2 TF connections between 2 hosts tried (all)"
    )


def test_a_thousand_hosts_try_log2_peers_each(tmp_path: Path) -> None:
    """1,000 hosts: 10,000 probes, not a million (and the selection never lists the million)."""
    probes = choose(fleet(tmp_path, 1000, workers), NetcheckMode.AUTO)
    assert probes.needed == 999_000 and probes.count == 1000 * 10  # log2: 1 .. 512


@pytest.mark.parametrize(
    ("written", "mode"),
    [("true", "auto"), ("false", "off"), ('"full"', "full"), ('"sampled"', "sampled")],
)
def test_the_inventory_names_the_mode(tmp_path: Path, written: str, mode: str) -> None:
    p = fleet(tmp_path, 2, workers, netcheck=f"netcheck = {written}\n")
    assert p.job.netcheck is NetcheckMode(mode)


@pytest.mark.parametrize(("written", "says"), [('"fulll"', "'full'"), ("3", "expected a string")])
def test_a_wrong_mode_is_an_inventory_error(tmp_path: Path, written: str, says: str) -> None:
    with pytest.raises(InventoryError, match=says):
        fleet(tmp_path, 2, workers, netcheck=f"netcheck = {written}\n")
