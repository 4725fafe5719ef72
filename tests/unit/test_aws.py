"""EC2 discovery against moto's EC2 implementation (no real AWS); `up` through a bastion on the
lab is tests/integration/test_aws.py.

moto is the sanctioned AWS stand-in: boto3 sends its real requests and moto answers them in this
process. The CLI therefore runs in-process here (`deployer.cli.main.run` with an injected Env): a
subprocess would not see moto's in-process EC2.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from deployer.core.errors import InventoryError
from deployer.sources import load_inventory
from deployer.sources.aws.settings import DiscoveryError
from tests.support.aws import ROOT, cli, described, launch, resolve_hosts, write_inventory

pytestmark = pytest.mark.names_tf(
    reason="plans inventories whose code is examples/digits on moto's EC2; starts no task"
)

WORKERS = """
[[aws.hosts]]
filters = { "tag:tfdeploy-job" = "mnist", "tag:tfdeploy-role" = "worker" }
ssh_address = "public"
tf_address = "private"
tasks = [{ role = "worker" }]
gpus = 1
"""


def test_discovers_running_tagged_instances_in_launch_order(ec2: Any, tmp_path: Path) -> None:
    worker = {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}
    running = [launch(ec2, worker) for _ in range(3)]
    stopped = launch(ec2, worker)
    ec2.stop_instances(InstanceIds=[stopped])
    gone = launch(ec2, worker)
    ec2.terminate_instances(InstanceIds=[gone])
    launch(ec2, {"tfdeploy-job": "other", "tfdeploy-role": "worker"})
    launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "ps"})
    static = '[[hosts]]\nname = "static1"\naddress = "10.1.1.1"\ntasks = [{ role = "chief" }]\n'
    inventory = load_inventory(write_inventory(tmp_path, WORKERS, static=static))
    assert [h.name for h in inventory.hosts] == ["static1"]  # loading does no discovery

    resolved = resolve_hosts(inventory)
    raw = sorted(described(ec2, running), key=lambda i: (i["LaunchTime"], i["InstanceId"]))
    assert [h.name for h in resolved.hosts] == ["static1"] + [i["InstanceId"] for i in raw]
    for host, instance in zip(resolved.hosts[1:], raw, strict=True):
        assert host.address == instance["PublicIpAddress"]  # ssh_address = "public"
        assert host.tf_address == instance["PrivateIpAddress"]  # tf_address = "private"
        assert host.gpus == 1 and not host.gpus_auto
        assert [t.role for t in host.tasks] == ["worker"]
    assert [i.id for i in resolved.instances] == [h.name for h in resolved.hosts[1:]]
    assert resolve_hosts(inventory).hosts == resolved.hosts  # stable across plan and up


def test_discovery_follows_every_page(ec2: Any, tmp_path: Path) -> None:
    ids = {launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}) for _ in range(12)}
    pages = list(ec2.get_paginator("describe_instances").paginate(PaginationConfig={"PageSize": 5}))
    assert len(pages) >= 3  # moto really pages: one describe call would see only 5
    inventory = load_inventory(write_inventory(tmp_path, WORKERS))
    resolved = resolve_hosts(inventory, page_size=5)
    assert {h.name for h in resolved.hosts} == ids


def test_plan_shows_the_discovered_instances(ec2: Any, tmp_path: Path) -> None:
    ids = [launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}) for _ in range(2)]
    path = write_inventory(tmp_path, WORKERS)
    code, out, err = cli("plan", str(path))
    assert code == 0, err
    for instance in described(ec2, ids):
        row = re.search(rf"^.*{instance['InstanceId']}.*$", out, re.M)
        assert row, out
        for value in ("g5.xlarge", instance["Placement"]["AvailabilityZone"]):
            assert value in row.group(0)
        assert instance["PrivateIpAddress"] in row.group(0)
        assert instance["PublicIpAddress"] in row.group(0)
    code, out, _ = cli("plan", "--json", str(path))
    doc = json.loads(out)
    assert sorted(i["id"] for i in doc["instances"]) == sorted(ids)
    assert {t["host"] for t in doc["tasks"]} == set(ids)


def test_zero_matches_is_an_error_naming_the_filters(ec2: Any, tmp_path: Path) -> None:
    launch(ec2, {"tfdeploy-job": "other", "tfdeploy-role": "worker"})
    code, _, err = cli("plan", str(write_inventory(tmp_path, WORKERS)))
    assert code == 2
    assert "aws.hosts[0].filters: no running EC2 instance in us-east-1 matches" in err
    assert "tag:tfdeploy-job=mnist, tag:tfdeploy-role=worker" in err


def test_missing_credentials_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No moto here: boto3 must stop before sending anything, for want of credentials.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-profile lookup
    inventory = load_inventory(write_inventory(tmp_path, WORKERS))
    with pytest.raises(DiscoveryError, match="no AWS credentials found") as info:
        resolve_hosts(inventory)
    assert info.value.hint and "aws configure" in info.value.hint
    code, _, err = cli("plan", str(write_inventory(tmp_path, WORKERS)))
    assert code == 2 and "error: no AWS credentials found" in err and "Traceback" not in err


def test_unknown_profile_and_missing_boto3_are_clear_errors(
    ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_inventory(tmp_path, 'profile = "nosuch"\n' + WORKERS)
    code, _, err = cli("plan", str(path))
    assert code == 2 and "AWS profile 'nosuch' is not configured" in err
    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import boto3` sees when absent
    code, _, err = cli("plan", str(write_inventory(tmp_path, WORKERS)))
    assert code == 2 and "boto3 is not installed" in err
    assert "pip install 'tfdeploy-cluster[aws]'" in err  # ours: PyPI's `tfdeploy` is another
    assert "pip install -e '.[aws]'" in err


def test_an_instance_matched_by_two_groups_is_an_error(ec2: Any, tmp_path: Path) -> None:
    launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"})
    both = WORKERS + WORKERS.replace('"worker" }\nssh', '["worker", "ps"] }\nssh')
    with pytest.raises(InventoryError, match=r"aws.hosts\[1\].filters: instance i-\w+ is also"):
        resolve_hosts(load_inventory(write_inventory(tmp_path, both)))


def test_public_address_wanted_but_missing(ec2: Any, tmp_path: Path) -> None:
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")["Subnet"]["SubnetId"]
    launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}, SubnetId=subnet)
    with pytest.raises(InventoryError, match=r"ssh_address: instance i-\w+ has no public IP"):
        resolve_hosts(load_inventory(write_inventory(tmp_path, WORKERS)))


def test_relative_identity_is_relative_to_the_inventory_in_aws_hosts_too(
    ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[[aws.hosts]] and [[hosts]] read `ssh` alike: a relative file is found next to the
    inventory, whatever the current directory is."""
    launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"})
    folder = tmp_path / "inventories"
    folder.mkdir()
    group = WORKERS + 'ssh = { identity = "keys/id", known_hosts = "kh" }\n'
    static = (
        '[[hosts]]\nname = "static1"\naddress = "10.1.1.1"\ntasks = [{ role = "chief" }]\n'
        'ssh = { identity = "keys/id", known_hosts = "kh" }\n'
    )
    path = write_inventory(folder, group, static=static)
    monkeypatch.chdir(tmp_path)
    hosts = resolve_hosts(load_inventory(path.relative_to(tmp_path))).hosts
    assert [(h.ssh.identity, h.ssh.known_hosts) for h in hosts] == [
        (str(folder / "keys" / "id"), str(folder / "kh"))
    ] * 2


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ('filters = { "tag:x" = 3 }', "aws.hosts[0].filters.tag:x: expected a string or a list"),
        ("filters = {}", "aws.hosts[0].filters: expected at least one filter"),
        ('filters = { "tag:x" = "y" }\nssh_address = "elastic"', "expected 'public' or 'private'"),
        (
            'filters = { "tag:x" = "y" }\ngpus = "many"',
            "expected an integer or \"auto\" (count with nvidia-smi), got 'many'",
        ),
        ('filters = { "tag:x" = "y" }\ngpu = 2', "unknown key"),
        ('filters = { "instance-state-name" = "stopped" }', "running instances only"),
        (
            'filters = { "tag:x" = "y" }\nworkdir = "rel"',
            "expected an absolute path or one starting",
        ),
    ],
)
def test_aws_section_mistakes_name_the_key(tmp_path: Path, snippet: str, message: str) -> None:
    group = f'[[aws.hosts]]\n{snippet}\ntasks = [{{ role = "worker" }}]\n'
    with pytest.raises(InventoryError) as info:
        load_inventory(write_inventory(tmp_path, group))
    assert message in info.value.message


def test_the_example_aws_inventory_plans_against_matching_instances(ec2: Any) -> None:
    example = ROOT / "inventories" / "aws.toml"
    text = example.read_text()
    assert "tensorflow[and-cuda]" in text and "jump" in text and "p4d.24xlarge" in text
    launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "chief"}, kind="p4d.24xlarge")
    for _ in range(2):
        launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}, kind="g5.12xlarge")
    for _ in range(2):
        launch(ec2, {"tfdeploy-job": "mnist", "tfdeploy-role": "ps"}, kind="c6i.4xlarge")
    code, out, err = cli("plan", "--json", str(example))
    assert code == 0, err
    doc = json.loads(out)
    roles = sorted(f"{t['role']}:{t['index']}" for t in doc["tasks"])
    assert roles == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    types = {i["id"]: i["type"] for i in doc["instances"]}
    chief = next(t for t in doc["tasks"] if t["role"] == "chief")
    assert types[chief["host"]] == "p4d.24xlarge"
    assert chief["gpus"] == list(range(8))  # the p4d's 8 GPUs, declared in the example
    ps_hosts = {t["host"] for t in doc["tasks"] if t["role"] == "ps"}
    assert {types[h] for h in ps_hosts} == {"c6i.4xlarge"}
    assert all(t["gpus"] == [] for t in doc["tasks"] if t["role"] == "ps")
