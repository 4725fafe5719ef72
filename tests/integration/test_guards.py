"""The run's guards on the lab (docs/up.md, "Guards"): a detached run's keeper stops it once its
stand-in GPUs sat at 0 % for the window (`gpu_idle_stop`), and an attached `up` stops a run on
EC2 instances (moto) once their cost reaches `max_cost`; each says why, in `attach`, `status`
and `runs`, and leaves nothing behind.

tests/fakes/nvidia-smi is a HARDWARE STAND-IN (the lab has no GPUs), in /root/bin of each lab
host, its utilization set by its state file; moto stands in for EC2 (its one spot price is
$0.00001 an hour) and tests/fakes/imds.py for the spot hosts' metadata service. The tasks are
the TF-shaped stand-in (tests/support/standin.py). The rules themselves, the keys, the pricing
and a keeper on this machine: tests/unit/test_guards.py.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.imds import Imds
from tests.lab import Lab
from tests.lab.base import wait_until
from tests.lab.inventory import toml_value
from tests.support import standin
from tests.support.aws import REGION, cli
from tests.support.faults import Up, tfdeploy
from tests.support.gpus import install, state

pytestmark = [pytest.mark.lab, pytest.mark.isolated]

STEPS = 400  # 100 s at 0.25 s a step: the guard, not the job's end, stops each run
STANDIN = f"{standin.NAME} --interval 0.25 {STEPS}"


@pytest.fixture
def gpu_hosts(clean_lab: Lab) -> Iterator[Lab]:
    """The first two lab hosts with one stand-in GPU each, busy at 90 %; removed after."""
    for host in clean_lab.hosts[:2]:
        install(clean_lab, host, state(1, util=[90]))
    yield clean_lab
    for host in clean_lab.hosts[:2]:
        clean_lab.run(host, "rm -rf /root/bin")


def test_a_detached_runs_keeper_stops_it_when_its_gpus_sit_idle_for_the_window(
    gpu_hosts: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """`up --detach` with gpu_idle_stop = { below = 5, minutes = 0.05 }: while the stand-in GPUs
    report 90 % the run goes on past the window; once both report 0 %, the keeper (its
    wardens sample nvidia-smi every 10 s) stops every task after 3 s. `attach` ends with it
    (exit 1) saying why, `status` says it under the run, `runs` records it `stopped` with the
    same words, and the keeper, the wardens and the tasks leave no process on any host."""
    lab = gpu_hosts
    h1, h2 = lab.hosts[:2]
    code = tmp_path / "code"
    standin.write(code)
    job = {
        "name": "idle",
        "command": f"{lab.python} {STANDIN}",
        "stop_grace": 2,
        "gpu_idle_stop": {"below": 5, "minutes": 0.05},
    }
    inventory = lab_inventory([[{"role": "worker", "gpus": [0]}]] * 2, code=code, job=job)
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    found = re.search(r"run (\S+) is running detached, kept by its keeper on", up.stdout)
    assert found, up.stdout
    run_id = found.group(1)
    watcher = Up(run_id, "-i", str(inventory), state=tmp_path / "other", verb="attach")
    watcher.wait_for(rf"attached to run {re.escape(run_id)}: its keeper holds")
    # 20 steps (5 s) at 90 %: past the 3 s window, and the run goes on.
    watcher.wait_for(r"worker:1@\S+ \| step 20$", timeout=90)
    assert watcher.proc.poll() is None, watcher.report()
    for host in (h1, h2):
        install(lab, host, state(1, util=[0]))
    assert watcher.finish(timeout=90) == 1, watcher.report()
    why = "every GPU of the run below 5 % for 3 s"
    said = " ".join((watcher.stdout + watcher.stderr).split())
    assert f"run {run_id} was stopped by its keeper: {why}" in said, watcher.report()

    shown = tfdeploy("status", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)
    assert f"stopped by its keeper: {why}" in " ".join(shown.stdout.split()), shown.stdout
    listed = tfdeploy(
        "status", run_id, "-i", str(inventory), "--json", state=tmp_path / "look", check_rc=0
    )
    runs = json.loads(listed.stdout)["runs"]
    assert [r["guard_stop"] for r in runs if r["guard_stop"]] == [why], runs
    tasks = [t for r in runs for t in r["tasks"]]
    assert {(t["state"], t["reason"]) for t in tasks} == {("exited", "stopped")}, tasks
    tfdeploy("status", run_id, state=tmp_path / "state", check_rc=0)  # the history learns its end
    history = tfdeploy("runs", "--json", state=tmp_path / "state", check_rc=0)
    [mine] = [r for r in json.loads(history.stdout)["runs"] if r["run_id"] == run_id]
    assert (mine["outcome"], mine["detail"]) == ("stopped", why), mine
    wait_until("the keeper and wardens to leave", lambda: not lab.leftovers(h1, 0), timeout=30)
    wait_until("h2's warden to leave", lambda: not lab.leftovers(h2, 0), timeout=30)
    tfdeploy("down", run_id, "-i", str(inventory), state=tmp_path / "look", check_rc=0)


# -- max_cost, on EC2 instances (moto) that are lab hosts ----------------------------------------


@pytest.fixture
def imds(lab: Lab) -> Iterator[Imds]:
    """The metadata service stand-in the spot hosts poll, on this machine's lab bridge address."""
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/24", strict=False)
    with Imds(str(network.network_address + 1)) as stand_in:
        yield stand_in


def _spot_instances(ec2: Any, lab: Lab, job: str) -> list[str]:
    """The first two lab hosts as Linux spot instances of `job` (moto takes the private IPs
    asked for; its first Amazon image is Windows, which tfdeploy does not price)."""
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/16", strict=False)
    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    # A zone moto has a spot price for: its history has none for us-east-1e, and a subnet
    # without a zone lands in any of the six.
    zone = f"{REGION}a"
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=str(network), AvailabilityZone=zone)
    subnet_id = subnet["Subnet"]["SubnetId"]
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    image = next(i["ImageId"] for i in images if i.get("Platform") != "windows")
    market = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    tags = [{"Key": "tfdeploy-job", "Value": job}, {"Key": "tfdeploy-role", "Value": "worker"}]
    return [
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType="g5.xlarge",
            SubnetId=subnet_id,
            PrivateIpAddress=host.address,
            InstanceMarketOptions=market,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]["InstanceId"]
        for host in lab.hosts[:2]
    ]


def test_max_cost_stops_an_attached_run_on_ec2_instances_when_their_cost_reaches_it(
    clean_lab: Lab, ec2: Any, imds: Imds, tmp_path: Path
) -> None:
    """Two spot instances at moto's $0.00001 an hour cost the run $0.0000000556 in 10 s:
    `max_cost = 0.0000000556` stops the attached `up` about 10 s into the run (or at its first
    look, when preparing it took longer). It was priced from the spot price history at `up`;
    the stop is clean: every task stopped, the artifacts pulled, `up` exits 1 saying why, and
    `runs` records it `stopped` with the same words."""
    lab = clean_lab
    job = "capped"
    ids = _spot_instances(ec2, lab, job)
    code = tmp_path / "code"
    standin.write(code)
    ssh = {
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "connect_timeout": 5,
    }
    path = tmp_path / "capped.toml"
    path.write_text(
        "[job]\n"
        f"name = {toml_value(job)}\ncode = {toml_value(str(code))}\n"
        f"command = {toml_value(f'{lab.python} {STANDIN}')}\n"
        f"python = {toml_value(lab.python)}\nrequire_tensorflow = false\nstop_grace = 2\n"
        f'artifacts = ["ckpt/**"]\nartifacts_to = {toml_value(str(tmp_path / "home"))}\n'
        "[ssh]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ssh.items()) + "[aws]\n"
        f'region = "{REGION}"\nmetadata_url = {toml_value(imds.url)}\n'
        "max_cost = 0.0000000556\n"
        "[[aws.hosts]]\n"
        f'filters = {{ "tag:tfdeploy-job" = "{job}", "tag:tfdeploy-role" = "worker" }}\n'
        'ssh_address = "private"\ntf_address = "private"\ntasks = [{ role = "worker" }]\n'
    )
    code_rc, out, err = cli("up", str(path))
    said = " ".join((out + err).split())
    assert code_rc == 1, f"{out}\n{err}"
    found = re.search(
        r"run (\S+) was stopped: its cost reached max_cost \$0\.0000000556 "
        r"\(spent \$0\.00000005\d*\)",
        said,
    )
    assert found, said
    run_id = found.group(1)
    assert f"done at step {STEPS}" not in out  # stopped, not finished
    for instance in ids:
        assert re.search(rf"worker:\d@{instance} \| checkpoints in ", out), out  # it ran
    # Clean: the artifacts came home as at any end, and nothing is left on the hosts.
    assert {p.name for p in (tmp_path / "home" / run_id).glob("*/ckpt/*")} == {
        "worker-0",
        "worker-1",
    }
    for host in lab.hosts[:2]:
        assert not lab.leftovers(host), lab.leftovers(host)
    listed = cli("runs", "--json")
    [mine] = [r for r in json.loads(listed[1])["runs"] if r["run_id"] == run_id]
    assert mine["outcome"] == "stopped" and mine["detail"].startswith(
        "its cost reached max_cost $0.0000000556 (spent $"
    ), mine
    assert mine["cost"]["usd"] is not None, mine  # priced from the same spot history
