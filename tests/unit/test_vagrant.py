"""vagrant/Vagrantfile and inventories/vagrant.toml must describe the same VMs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from deployer.config.inventory import load_inventory
from deployer.config.plan import make_plan

REPO = Path(__file__).resolve().parents[2]


def _vagrant_constants() -> dict[str, str]:
    text = (REPO / "vagrant" / "Vagrantfile").read_text()
    return dict(re.findall(r'^([A-Z_]+) = "?([^"\n]+?)"?$', text, re.MULTILINE))


def test_inventory_matches_the_vagrantfile() -> None:
    const = _vagrant_constants()
    n, first, prefix = int(const["N"]), int(const["FIRST_IP"]), const["IP_PREFIX"]
    expected = [(f"h{i}", f"{prefix}{first + i - 1}") for i in range(1, n + 1)]
    inventory = tomllib.loads((REPO / "inventories" / "vagrant.toml").read_text())
    assert [(h["name"], h["address"]) for h in inventory["hosts"]] == expected
    assert all(h["tasks"] for h in inventory["hosts"])
    assert inventory["ssh"]["host_keys"] == "strict"
    # The Vagrantfile names its VMs h1..hN with these hostnames, as the inventory does.
    assert 'node.vm.hostname = "h#{i}"' in (REPO / "vagrant" / "Vagrantfile").read_text()


def test_provision_script_installs_python_tensorflow_and_the_key() -> None:
    script = (REPO / "vagrant" / "provision.sh").read_text()
    inventory = tomllib.loads((REPO / "inventories" / "vagrant.toml").read_text())
    assert inventory["job"]["python"].startswith("/opt/tfdeploy/venv/")
    assert "python3 -m venv /opt/tfdeploy/venv" in script and "tensorflow" in script
    assert "authorized_keys" in script


def test_the_vagrant_inventory_plans_one_mwms_worker_per_vm() -> None:
    """The file is a valid inventory: code dir, key paths and tasks resolve as a user runs it."""
    inventory = load_inventory(REPO / "inventories" / "vagrant.toml")
    plan = make_plan(inventory)
    assert [t.endpoint for t in plan.tasks] == [f"192.168.56.{i}:2222" for i in (11, 12)]
    assert (inventory.job.code / "mwms.py").is_file()
    assert inventory.hosts[0].ssh.identity == str(REPO / ".vagrant-lab" / "id_ed25519")
