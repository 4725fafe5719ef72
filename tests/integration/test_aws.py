"""`up` on EC2 instances discovered in moto's EC2 whose addresses are the bastion lab's private
hosts: its job runs through the bastion (discovery itself: tests/unit/test_aws.py).

The job's tasks are the TF-shaped stand-in (tests/support/standin.py): the subject is discovery
and routing, not TensorFlow. With --peers each task dials the other at the discovered private
address before its first step, as MWMS's collectives do (real MWMS across hosts:
tests/integration/test_seed_programs.py).

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
from tests.support import standin
from tests.support.aws import REGION, cli, described, launch

# -- end to end: EC2 instances (moto) whose addresses are the bastion lab's private hosts ----------


@pytest.mark.lab
@pytest.mark.isolated
@pytest.mark.needs_tf(reason="preflight wants TensorFlow on the hosts; the tasks never import it")
@pytest.mark.slow
def test_up_on_discovered_instances_runs_its_job_through_the_bastion(
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
    job_code = tmp_path / "code"
    standin.write(job_code)
    # The cluster each task was given, then the stand-in, which dials the others at those addresses.
    command = f'echo "TF_CONFIG=$TF_CONFIG"; {lab.python} {standin.NAME} 4 --peers'
    path = tmp_path / "aws-lab.toml"
    path.write_text(
        "[job]\n"
        f'name = "labjob"\ncode = {toml_value(str(job_code))}\n'
        f"command = {toml_value(command)}\n"
        f"python = {toml_value(lab.python)}\n"
        f"[ssh]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ssh.items()) + "[aws]\n"
        f'region = "{REGION}"\n'
        "[[aws.hosts]]\n"
        'filters = { "tag:tfdeploy-job" = "labjob", "tag:tfdeploy-role" = "worker" }\n'
        'ssh_address = "private"\ntf_address = "private"\ntasks = [{ role = "worker" }]\n'
    )
    code, out, err = cli("up", str(path))
    assert code == 0, f"{out}\n{err}"
    labels = [f"worker:{n}@{i['InstanceId']}" for n, i in enumerate(order)]
    reached = dict(re.findall(r"^(\S+@\S+)\s+\| worker \d reached (.*)$", out, re.M))
    others = {
        label: " ".join(f"worker:{m}" for m in range(len(labels)) if m != n)
        for n, label in enumerate(labels)
    }
    assert reached == others, out  # each task dialled every other at its private address
    done = re.findall(r"^(\S+@\S+)\s+\| worker \d done at step 4$", out, re.M)
    assert sorted(done) == sorted(labels), out
    cluster = [f"{i['PrivateIpAddress']}:2222" for i in order]
    configs = re.findall(r"^\S+\s+\| TF_CONFIG=(\{.*\})$", out, re.M)
    assert {json.dumps(json.loads(c)["cluster"]) for c in configs} == {
        json.dumps({"worker": cluster})
    }
    for h in lab.hosts:
        assert not lab.leftovers(h), lab.leftovers(h)
