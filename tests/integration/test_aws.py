"""`up` on EC2 instances discovered in moto's EC2 whose addresses are the bastion lab's private
hosts: it trains through the bastion (discovery itself: tests/unit/test_aws.py).

The CLI runs in-process (`deployer.cli.main.run` with an injected Env): a subprocess would not see
moto's in-process EC2.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.lab.inventory import toml_value
from tests.support.aws import EXAMPLES, REGION, cli, described, launch

# -- end to end: EC2 instances (moto) whose addresses are the bastion lab's private hosts ----------


@pytest.mark.lab
@pytest.mark.isolated
@pytest.mark.starts_tf
@pytest.mark.slow
def test_up_on_discovered_instances_trains_through_the_bastion(
    bastion_lab: Lab, ec2: Any, tmp_path: Path
) -> None:
    lab = bastion_lab
    assert lab.bastion is not None
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/16", strict=False)
    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=str(network))["Subnet"]["SubnetId"]
    # moto takes the private IP we ask for: the "EC2" instances are the lab's private hosts.
    ids = [
        launch(
            ec2,
            {"tfdeploy-job": "labjob", "tfdeploy-role": "worker"},
            SubnetId=subnet,
            PrivateIpAddress=h.address,
        )
        for h in lab.hosts
    ]
    by_ip = {i["PrivateIpAddress"]: i for i in described(ec2, ids)}
    order = sorted(by_ip.values(), key=lambda i: (i["LaunchTime"], i["InstanceId"]))
    jump = f"{lab.user}@{lab.bastion.address}:{lab.bastion.port}"
    ssh = {
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "jump": jump,
        "connect_timeout": 5,
    }
    tf_env = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    path = tmp_path / "aws-lab.toml"
    path.write_text(
        "[job]\n"
        f'name = "labjob"\ncode = {toml_value(EXAMPLES)}\n'
        f"command = {toml_value(lab.python + ' mwms.py --epochs 4')}\n"
        f"python = {toml_value(lab.python)}\nenv = {toml_value(tf_env)}\n"
        f"[ssh]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ssh.items()) + "[aws]\n"
        f'region = "{REGION}"\n'
        "[[aws.hosts]]\n"
        'filters = { "tag:tfdeploy-job" = "labjob", "tag:tfdeploy-role" = "worker" }\n'
        'ssh_address = "private"\ntf_address = "private"\ntasks = [{ role = "worker" }]\n'
    )
    code, out, err = cli("up", str(path))
    assert code == 0, f"{out}\n{err}"
    accuracy = dict(re.findall(r"^(\S+@\S+)\s+\| test_accuracy=([0-9.]+)$", out, re.M))
    assert set(accuracy) == {f"worker:{n}@{i['InstanceId']}" for n, i in enumerate(order)}
    assert min(float(a) for a in accuracy.values()) >= 0.9
    cluster = [f"{i['PrivateIpAddress']}:2222" for i in order]
    configs = re.findall(r"^\S+\s+\| tfdeploy-env TF_CONFIG=(\{.*\}) CUDA", out, re.M)
    assert {json.dumps(json.loads(c)["cluster"]) for c in configs} == {
        json.dumps({"worker": cluster})
    }
    for h in lab.hosts:
        assert not lab.leftovers(h), lab.leftovers(h)
