"""The network check above its full-check threshold, on 40 namespace hosts: the default sample
still finds a port dropped on one host and a host that cannot reach part of the fleet; with
only a pair it does not hold blocked it passes (no false failure), and `--netcheck full` finds
that pair and makes every other connection.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.lab
from deployer.up.netplan import FULL_UP_TO
from tests.lab import Lab, cleanup, start_lab
from tests.support.lab_cli import tfdeploy
from tests.support.on_lab import blocked, filtered

pytestmark = [pytest.mark.lab, pytest.mark.isolated, pytest.mark.slow]

HOSTS = 40  # above FULL_UP_TO: `auto` samples
TIMEOUT = 120  # for one CLI call on 40 hosts sharing this machine's cores


@pytest.fixture(scope="module")
def big_lab() -> Iterator[Lab]:
    if tests.lab.lab_mode() != "netns":
        pytest.skip("nft rules need each host's own network namespace (root)")
    cleanup.clean_stale()
    lab = start_lab(HOSTS)
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def inventory(big_lab: Lab, tmp_path: Path) -> Iterator[Path]:
    """One MultiWorkerMirrored worker per host: every host dials every other (1,560 pairs)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained')\n")
    yield big_lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}]] * HOSTS,
        job={"code": str(code), "name": "netscale", "stop_grace": 1},
    )
    for host in big_lab.hosts:
        assert not big_lab.leftovers(host), (host.name, big_lab.leftovers(host))


def check(
    inventory: Path, tmp_path: Path, *args: str, rc: int, timeout: float = TIMEOUT
) -> tuple[str, str]:
    done = tfdeploy("check", str(inventory), *args, state=tmp_path / "state", timeout=timeout)
    assert done.returncode == rc, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout, done.stderr


def test_the_sample_finds_a_port_dropped_on_one_host(
    big_lab: Lab, inventory: Path, tmp_path: Path
) -> None:
    victim = big_lab.hosts[16]
    with filtered(big_lab, victim, "input", "tcp dport 2222 drop"):
        _, err = check(inventory, tmp_path, rc=3)
    line = next(x for x in err.splitlines() if f"-> {victim.name} (" in x)
    assert line.endswith("timed out (a firewall or security group dropping the TF port?)")
    assert "and 7 more ->" in line  # the 8 hosts of the sample that dial it, on one line
    assert "8 TF connections of 320 tried (a sample: others may fail too)" in err
    assert "`--netcheck full` tries every connection" in err


def test_the_sample_finds_a_host_that_cannot_reach_part_of_the_fleet(
    big_lab: Lab, inventory: Path, tmp_path: Path
) -> None:
    """h5 cannot reach the hosts listed last (a route or security group to another subnet)."""
    source, far = big_lab.hosts[4], big_lab.hosts[20:]
    addresses = ", ".join(h.address for h in far)
    with filtered(big_lab, source, "output", f"ip daddr {{ {addresses} }} tcp dport 2222 drop"):
        _, err = check(inventory, tmp_path, rc=3)
    found = [x for x in err.splitlines() if x.startswith(f"  {source.name} -> ")]
    assert found and all(any(f"-> {h.name} (" in x for h in far) for x in found), err


def test_the_sample_passes_a_fleet_whose_one_blocked_pair_only_full_finds(
    big_lab: Lab, inventory: Path, tmp_path: Path
) -> None:
    """h1 tries h2-h6, h9, h17, h33 (1, 2, 3, 4, 5, 8, 16, 32 after it): h1 -> h20 alone
    blocked is what a sample can miss, and what `--netcheck full` is for. The sampled check
    passes as on a healthy fleet (no false failure); the full one tries every pair and finds
    the blocked one. (A healthy fleet's full check is the other 1,559 pairs of it.)"""
    assert HOSTS > FULL_UP_TO
    h1, h20 = big_lab.hosts[0], big_lab.hosts[19]
    with blocked(big_lab, h20, h1, 2222, "drop"):
        out, _ = check(inventory, tmp_path, rc=0)
        assert (
            f"network check: {HOSTS * 8} of 1,560 TF connections between {HOSTS} hosts tried "
            "(sampled: each host dials 8+ other hosts; each server is dialled from 8+ hosts; "
            "--netcheck full tries all)" in out
        )
        _, err = check(inventory, tmp_path, "--netcheck", "full", rc=3)
    assert f"  {h1.name} -> {h20.name} ({h20.address}:2222): timed out" in err
    assert "1 TF connection of 1,560 cannot be made" in err
    assert err.count(" -> ") == 1, err  # the other 1,559 connections were made


LARGE_ENV = "TFDEPLOY_NETCHECK_LARGE"  # e.g. 240: a lab of that many hosts, once, by hand


@pytest.mark.skipif(not os.environ.get(LARGE_ENV), reason=f"{LARGE_ENV}=N runs it on N hosts")
def test_no_false_failure_on_a_large_fleet(tmp_path: Path) -> None:
    """Every host of a large lab dials at once, sampled (the default) and in full: nothing
    fails that is not blocked, however long the probe queues on these shared cores get."""
    if tests.lab.lab_mode() != "netns":
        pytest.skip("needs the namespace lab (root)")
    n = int(os.environ[LARGE_ENV])
    lab = start_lab(n)
    try:
        code = tmp_path / "code"
        code.mkdir()
        (code / "train.py").write_text("print('trained')\n")
        inventory = lab.write_inventory(
            tmp_path / "inventory.toml",
            tasks=[[{"role": "chief"}]] + [[{"role": "worker"}]] * (n - 1),
            job={"code": str(code), "name": "netlarge"},
        )
        for args, says in (((), "(sampled: "), (("--netcheck", "full"), "tried (all)")):
            began = time.monotonic()
            out, _ = check(inventory, tmp_path, *args, rc=0, timeout=600)
            line = next(x for x in out.splitlines() if "network check:" in x)
            print(f"{n} hosts, {' '.join(args) or 'default'}: {time.monotonic() - began:.1f} s")
            print(line[line.index("network check:") :])
            assert says in line
        for host in lab.hosts:
            assert not lab.leftovers(host), (host.name, lab.leftovers(host))
    finally:
        lab.stop()
