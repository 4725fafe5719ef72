"""The network check on the lab: real nftables rules in a host's own network namespace drop or
reject one peer's packets to a TF port, and `check`/`up` name that pair before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.helpers import toml_value
from tests.support.lab_cli import tfdeploy
from tests.support.on_lab import blocked

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # rules need each host's own netns


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained')\n")
    return code


def inventory(lab_inventory: Any, code: Path, tasks: list[list[dict[str, Any]]]) -> Path:
    return lab_inventory(
        tasks,
        code=code,
        job={"name": "net", "command": "python3 train.py", "stop_grace": 1},
    )


MWMS = [[{"role": "worker"}], [{"role": "worker"}], [{"role": "worker"}]]
PSS = [[{"role": "chief"}], [{"role": "worker"}], [{"role": "ps"}]]


def test_a_dropped_tf_port_fails_check_and_up_naming_the_pair(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h2 = lab.hosts[0], lab.hosts[1]
    inv = inventory(lab_inventory, code, MWMS)
    with blocked(lab, h2, h1, 2222, "drop"):
        for verb in ("check", "up"):
            # A dropped port is a timeout, not a hang: the run ends well within the bound.
            result = tfdeploy(verb, str(inv), state=tmp_path / "state", check_rc=3, timeout=60)
            assert f"{h1.name} -> {h2.name} ({h2.address}:2222): timed out" in result.stderr
            assert "security group" in result.stderr and "allow TCP port 2222" in result.stderr
            assert "starting" not in result.stdout and "pushed" not in result.stdout
            for host in lab.hosts[:3]:
                assert not lab.leftovers(host), lab.leftovers(host)


def test_a_rejected_tf_port_is_reported_as_refused(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h3 = lab.hosts[0], lab.hosts[2]
    inv = inventory(lab_inventory, code, MWMS)
    with blocked(lab, h1, h3, 2222, "reject"):
        result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
    assert f"{h3.name} -> {h1.name} ({h1.address}:2222): refused" in result.stderr
    assert "timed out" not in result.stderr


def test_a_healthy_cluster_passes_and_check_starts_nothing(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    inv = inventory(lab_inventory, code, MWMS)
    result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=0)
    assert "network check: 6 TF connections between 3 hosts tried (all)" in result.stdout
    assert "check ok: nothing was started (up would start 3 tasks on 3 hosts)" in result.stdout
    up = tfdeploy("up", str(inv), state=tmp_path / "state", check_rc=0)
    assert "trained" in up.stdout


def test_pss_pairs_only_what_tf_connects(
    clean_lab: Lab, lab_inventory: Any, code: Path, tmp_path: Path
) -> None:
    """A ps never dials a worker, so blocking that direction is harmless; the reverse is not."""
    lab = clean_lab
    chief, worker, ps = lab.hosts[0], lab.hosts[1], lab.hosts[2]
    inv = inventory(lab_inventory, code, PSS)
    with blocked(lab, worker, ps, 2222, "drop"):
        tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=0)
    with blocked(lab, ps, worker, 2222, "drop"):
        result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
    assert f"{worker.name} -> {ps.name} ({ps.address}:2222): timed out" in result.stderr
    assert chief.name + " ->" not in result.stderr
    assert "--no-netcheck" in result.stderr
    skipped = tfdeploy("check", str(inv), "--no-netcheck", state=tmp_path / "state")
    assert skipped.returncode == 0 and "TF connections" not in skipped.stdout


def alias_inventory(lab: Lab, code: Path, tmp_path: Path, tf_address: str | None = None) -> Path:
    """Hosts h1-h3 named by the lab ssh_config's aliases only (HostName, Port, User from it)."""
    text = "\n".join(
        [
            "[job]",
            'name = "alias"',
            f"code = {toml_value(str(code))}",
            'command = "python3 train.py"',
            f"python = {toml_value(lab.python)}",
            "stop_grace = 1",
            "",
            "[ssh]",
            f"ssh_config = {toml_value(str(lab.ssh_config))}",
            f"known_hosts = {toml_value(str(lab.known_hosts))}",
            "connect_timeout = 5",
        ]
    )
    for i, h in enumerate(lab.hosts[:3]):
        text += f"\n\n[[hosts]]\naddress = {toml_value(h.name)}\n"
        if tf_address is not None and i == 1:
            text += f"tf_address = {toml_value(tf_address)}\n"
        text += 'tasks = [{ role = "worker" }]\n'
    path = tmp_path / "alias.toml"
    path.write_text(text)
    return path


def test_aliases_get_their_hostname_as_tf_address_and_an_unresolved_one_a_dns_hint(
    clean_lab: Lab, code: Path, tmp_path: Path
) -> None:
    lab = clean_lab
    h1, h2 = lab.hosts[0], lab.hosts[1]
    inv = alias_inventory(lab, code, tmp_path)
    result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=0)
    assert "network check: 6 TF connections between 3 hosts tried (all)" in result.stdout
    planned = tfdeploy("plan", str(inv), "--json", state=tmp_path / "state", check_rc=0)
    assert f'"{h2.address}:2222"' in planned.stdout and f'"{h2.name}:2222"' not in planned.stdout
    # The alias written as tf_address is known only to this machine: the check says so.
    inv = alias_inventory(lab, code, tmp_path, tf_address=f"{h2.name}.alias.invalid")
    result = tfdeploy("check", str(inv), state=tmp_path / "state", check_rc=3)
    err = " ".join(result.stderr.split())
    assert (
        f"{h1.name} and " in err
        and f"-> {h2.name} ({h2.name}.alias.invalid:2222): unresolved" in err
    )
    assert "the source host cannot resolve this name: is it in DNS" in err
    assert "set tf_address to an IP address or a name every host resolves" in err
    assert "security group" not in err
