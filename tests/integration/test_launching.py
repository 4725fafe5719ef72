"""The plumbing every launching host source shares (deployer/sources/launching.py), driven by a
second source that is one module (tests/support/lab_source.py): machines whose sshd starts late
are waited on all at once, their keys pinned out of band, ended on failure and when due."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deployer.config.inventory import Inventory, load_inventory, provision_hosts
from deployer.config.sources import AT_DOWN, AT_JOB_END
from deployer.core.errors import HostsFailed
from deployer.hosts.fleet import open_transport
from tests.lab import Lab
from tests.support.lab_source import LabCloud, lab_cloud, reader

N = 4
BOOT_S = 2.0
LATENCY_MS = 100  # each way: a handshake is several round trips, ~1.5 s here


def inventory(tmp_path: Path, lab: Lab, cloud: LabCloud, lab_table: str) -> Inventory:
    (tmp_path / "code").mkdir(exist_ok=True)
    path = tmp_path / "inventory.toml"
    path.write_text(
        f"""
[job]
name = "launch"
code = "code"
command = "true"
require_tensorflow = false

[ssh]
user = "{lab.user}"
identity = "{lab.key_path}"
known_hosts = "{tmp_path / "known_hosts"}"
host_keys = "strict"
connect_timeout = 5
ssh_config = "/dev/null"

[lab]
{lab_table}
tasks = [{{ role = "worker" }}]
"""
    )
    return load_inventory(path, {"lab": lambda: reader(cloud)})


def handshake_s(inv: Inventory) -> float:
    """What one connection to a launched host costs (through its delay proxy)."""
    transport = open_transport(inv.hosts[0])
    started = time.monotonic()
    try:
        transport.connect()
        return time.monotonic() - started
    finally:
        transport.close()


def test_late_machines_are_waited_on_at_once_and_end_when_due(lab: Lab, tmp_path: Path) -> None:
    said: list[str] = []
    with lab_cloud(lab, lab.hosts[-N:]) as cloud:
        table = f"count = {N}\nboot_seconds = {BOOT_S}\nlatency_ms = {LATENCY_MS}"
        inv = inventory(tmp_path, lab, cloud, table)
        started = time.monotonic()
        inv, held = provision_hosts(inv, said.append)
        assert held.held == ()  # launched machines end when due, not with one `up`
        took = time.monotonic() - started
        one = handshake_s(inv)

        names = [h.name for h in lab.hosts[-N:]]
        assert [h.name for h in inv.hosts] == names
        assert all(h.ssh.expected_keys for h in inv.hosts)  # pinned from the lab's records
        assert said == [f"launched {', '.join(names)}", f"waiting for SSH on {', '.join(names)}"]
        # One after the other, the last handshake would begin after N-1 others: BOOT_S + N x one.
        assert BOOT_S <= took < BOOT_S + 2.5 * one, f"{took:.1f} s, one handshake {one:.1f} s"

        (source,) = inv.sources
        source.terminate(AT_JOB_END, said.append)  # terminate_after = "down": not yet
        assert cloud.ended == []
        source.terminate(AT_DOWN, said.append)
        assert cloud.ended == names
        assert said[-1] == f"terminated {N} machines tfdeploy launched: {', '.join(names)}"


def test_a_machine_that_never_answers_is_named_and_every_launched_one_ended(
    lab: Lab, tmp_path: Path
) -> None:
    said: list[str] = []
    hosts = lab.hosts[-2:]
    with lab_cloud(lab, hosts) as cloud:
        table = f'count = 2\nboot_seconds = 0.5\nnever_boot = ["{hosts[1].name}"]\ntimeout = 3'
        inv = inventory(tmp_path, lab, cloud, table)
        with pytest.raises(HostsFailed) as info:
            provision_hosts(inv, said.append)
        message = info.value.message
        assert message.startswith("SSH did not answer before lab.timeout ran out on 1 host:")
        assert f"\n  {hosts[1].name}: " in message and f"{hosts[0].name}:" not in message
        assert cloud.ended == [h.name for h in hosts]
        assert said[-1] == "terminated the 2 machines this up launched"
