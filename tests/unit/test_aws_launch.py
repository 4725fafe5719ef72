"""`[aws]` launch tables against moto's EC2: what `plan` shows, what `up` may launch, and what
`down --terminate` ends. No SSH here: the lab tests (tests/integration/test_aws_launch.py)
deploy onto them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.core.authorization import enable_iam_authentication

from deployer.config.sources import ANY_TIME, AT_DOWN
from deployer.core.errors import InventoryError
from deployer.sources import load_inventory
from deployer.sources.aws import AwsSource
from deployer.sources.aws.launch import (
    LaunchError,
    launch_request,
    parse_fingerprints,
    provision,
)
from deployer.sources.aws.settings import LAUNCHED_TAG, AwsSettings
from tests.support.aws import REGION, cli, launch, write_inventory

pytestmark = pytest.mark.names_tf(
    reason="launches moto's instances for inventories whose code is examples/digits; starts no task"
)

GROUP = """
[[aws.hosts]]
filters = {{ "tag:tfdeploy-job" = "mnist", "tag:tfdeploy-role" = "worker" }}
ssh_address = "private"
tf_address = "private"
tasks = [{{ role = "worker" }}]
launch = {{ instance_type = "g5.xlarge", image_id = "{ami}", count = {count}{extra} }}
"""


_IMAGES: list[str] = []


def ami(ec2: Any) -> str:
    if not _IMAGES:  # describing moto's images is slow: once per module
        _IMAGES.append(ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"])
    return _IMAGES[0]


def inventory(tmp_path: Path, ec2: Any, *, count: int = 3, extra: str = "", aws: str = "") -> Path:
    return write_inventory(tmp_path, aws + GROUP.format(ami=ami(ec2), count=count, extra=extra))


def settings_of(path: Path) -> AwsSettings:
    (source,) = load_inventory(path).pending
    assert isinstance(source, AwsSource)
    return source.settings


def states(ec2: Any, *, terminated: bool = False) -> dict[str, str]:
    """Instance id -> state; terminated ones only if asked (the module's one moto keeps those
    of earlier tests)."""
    reply = ec2.describe_instances()
    return {
        i["InstanceId"]: i["State"]["Name"]
        for r in reply["Reservations"]
        for i in r["Instances"]
        if terminated or i["State"]["Name"] != "terminated"
    }


WORKER = {"tfdeploy-job": "mnist", "tfdeploy-role": "worker"}


def test_plan_shows_what_up_would_launch_and_launches_nothing(ec2: Any, tmp_path: Path) -> None:
    running = launch(ec2, WORKER)
    path = inventory(tmp_path, ec2, extra=", spot = true")
    code, out, err = cli("plan", "--json", str(path))
    assert code == 0, err
    doc = json.loads(out)
    assert [i["id"] for i in doc["instances"]] == [running, "launch-2", "launch-3"]
    assert [i["launched"] is None for i in doc["instances"]] == [False, True, True]
    assert [(t["role"], t["index"], t["host"]) for t in doc["tasks"]] == [
        ("worker", 0, running),
        ("worker", 1, "launch-2"),
        ("worker", 2, "launch-3"),
    ]
    code, out, err = cli("plan", str(path))
    assert "1 running, 2 to launch by `up`" in out
    assert out.count("(to launch)") == 2 and "spot" in out
    assert set(states(ec2)) == {running}  # nothing was launched


def test_check_refuses_a_fleet_not_launched_yet(ec2: Any, tmp_path: Path) -> None:
    code, _, err = cli("check", str(inventory(tmp_path, ec2, count=2)))
    assert code == 2
    assert "2 instances of the fleet are not launched yet" in err
    assert states(ec2) == {}


def test_launch_request_tags_with_the_filters_and_the_job(ec2: Any, tmp_path: Path) -> None:
    extra = (
        ', spot = true, max_price = "0.50", subnet_id = "subnet-1", key_name = "k", '
        'security_group_ids = ["sg-1"], iam_instance_profile = "trainer", '
        'root_volume_gb = 200, tags = { team = "ml" }'
    )
    (group,) = settings_of(inventory(tmp_path, ec2, extra=extra)).groups
    request = launch_request(ec2, group, 2, "mnist")
    tags = {t["Key"]: t["Value"] for t in request["TagSpecifications"][0]["Tags"]}
    assert tags == {
        "Name": "tfdeploy-mnist",
        "team": "ml",
        "tfdeploy-job": "mnist",
        "tfdeploy-role": "worker",
        LAUNCHED_TAG: "mnist",
        "tfdeploy:group": "aws.hosts[0]",
    }
    assert request["MinCount"] == request["MaxCount"] == 2
    assert request["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "MaxPrice": "0.50"},
    }
    assert request["IamInstanceProfile"] == {"Name": "trainer"}
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    (volume,) = request["BlockDeviceMappings"]
    assert volume["Ebs"] == {"VolumeSize": 200, "DeleteOnTermination": True}
    assert volume["DeviceName"].startswith("/dev/")


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        (', max_price = "1"', "launch.max_price", "spot instances only"),
        (', spot = true, max_price = "cheap"', "launch.max_price", "a price in USD"),
        (', launch_template = "lt-1"', "launch.image_id", "exactly one of"),
        (", terminate_after = 'never!'", "launch.terminate_after", "'down' or 'job-end'"),
        (", tags = { 'aws:x' = 'y' }", "launch.tags.aws:x", "reserved"),
        (", idle_minute = 5", "launch.idle_minute", "did you mean 'idle_minutes'"),
    ],
)
def test_launch_table_mistakes_name_the_key(
    ec2: Any, tmp_path: Path, extra: str, key: str, message: str
) -> None:
    path = inventory(tmp_path, ec2, extra=extra)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    text = f"{caught.value}\n{caught.value.hint}"
    assert f"aws.hosts[0].{key}" in text and message in text and str(path) in text


def test_a_group_that_launches_must_find_what_it_launches(tmp_path: Path) -> None:
    group = (
        '[[aws.hosts]]\nfilters = { "availability-zone" = "us-east-1a" }\n'
        'tasks = [{ role = "worker" }]\nlaunch = { image_id = "ami-1", instance_type = "t3.micro",'
        " count = 1 }\n"
    )
    with pytest.raises(InventoryError, match="needs a tag filter"):
        load_inventory(write_inventory(tmp_path, group))
    group = group.replace('"availability-zone" = "us-east-1a"', '"tag:role" = ["a", "b"]')
    with pytest.raises(InventoryError, match="one value per tag filter"):
        load_inventory(write_inventory(tmp_path, group))


def test_more_than_max_launch_launches_nothing(ec2: Any, tmp_path: Path) -> None:
    path = inventory(tmp_path, ec2, count=5, aws="max_launch = 4\n")
    with pytest.raises(InventoryError) as caught:
        provision(settings_of(path), str(path), lambda line: None)
    assert "up would launch 5 instances" in str(caught.value)
    assert "max_launch = 4" in str(caught.value) and caught.value.key == "aws.max_launch"
    assert states(ec2) == {}


def test_missing_launch_permission_is_named_before_anything_launches(
    ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = inventory(tmp_path, ec2, count=2)
    iam = boto3.client("iam", region_name=REGION)
    iam.create_user(UserName="reader")
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    # moto checks each request against the caller's IAM policies, as EC2 would
    with enable_iam_authentication(), pytest.raises(LaunchError) as caught:
        provision(settings_of(path), str(path), lambda line: None)
    assert "EC2 refused run_instances launching 2 x g5.xlarge (on-demand) for aws.hosts[0]" in str(
        caught.value
    )
    assert "not authorized" in str(caught.value)  # moto: AccessDenied; EC2: UnauthorizedOperation
    assert "ec2:RunInstances" in (caught.value.hint or "")


def test_down_terminate_ends_only_what_tfdeploy_launched(ec2: Any, tmp_path: Path) -> None:
    found = launch(ec2, WORKER)  # the user's own instance: discovered, never terminated
    path = inventory(tmp_path, ec2, count=3, extra=', terminate_after = "never"')
    settings = settings_of(path)
    group = settings.groups[0]
    ours = ec2.run_instances(**launch_request(ec2, group, 2, "mnist"))["Instances"]
    other_job = ec2.run_instances(**launch_request(ec2, group, 1, "other"))["Instances"]
    (source,) = load_inventory(path).sources
    lines: list[str] = []
    source.terminate(AT_DOWN, lines.append)
    assert lines == []  # terminate_after = "never"
    source.terminate(ANY_TIME, lines.append)
    ids = sorted(i["InstanceId"] for i in ours)
    assert lines == [f"terminated 2 instances tfdeploy launched: {', '.join(ids)}"]
    now = states(ec2, terminated=True)
    assert {now[i] for i in ids} == {"terminated"}
    assert now[found] == "running" and now[other_job[0]["InstanceId"]] == "running"


def test_fingerprints_are_read_between_cloud_init_markers() -> None:
    console = (
        "[   12.1] cloud-init[700]: SHA256:notthisone outside the block\n"
        "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
        "ec2: 256 SHA256:AbC+/9 root@ip-10-0-0-5 (ECDSA)\n"
        "ec2: 256 SHA256:XyZ0 root@ip-10-0-0-5 (ED25519)\n"
        "ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\necdsa-sha2-nistp256 AAAA root@x\n"
    )
    assert parse_fingerprints(console) == ("SHA256:AbC+/9", "SHA256:XyZ0")
    assert parse_fingerprints("booting...\n") == ()
