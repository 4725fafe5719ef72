"""EC2 on moto for the AWS tests: launch and describe instances, run the CLI in-process.

The CLI runs in-process (`deployer.cli.main.run` with an injected Env): a subprocess would not see
moto's in-process EC2. The `ec2` fixture is in tests/conftest.py.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from deployer.cli.main import Env, run
from deployer.config.inventory import Inventory, discover_hosts
from deployer.sources.aws import AwsSource
from deployer.sources.aws.settings import PAGE_SIZE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "digits"
REGION = "us-east-1"


_AMI: dict[str, str] = {}


def launch(ec2: Any, tags: dict[str, str], *, kind: str = "g5.xlarge", **extra: Any) -> str:
    """One instance in its own reservation (moto pages describe_instances by reservation)."""
    if "ami" not in _AMI:  # describing moto's images is slow: once per module
        _AMI["ami"] = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    reply = ec2.run_instances(
        ImageId=_AMI["ami"],
        MinCount=1,
        MaxCount=1,
        InstanceType=kind,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
        **extra,
    )
    return str(reply["Instances"][0]["InstanceId"])


def described(ec2: Any, ids: list[str]) -> list[dict[str, Any]]:
    reply = ec2.describe_instances(InstanceIds=ids)
    return [i for r in reply["Reservations"] for i in r["Instances"]]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = Env(
        out=Console(file=out, width=250, color_system=None),
        err=Console(file=err, width=250, color_system=None),
        raw_out=out,
    )
    code = run(list(argv), env)
    return int(code), out.getvalue(), err.getvalue()


def write_inventory(tmp_path: Path, aws: str, *, static: str = "", job: str = "") -> Path:
    path = tmp_path / "aws.toml"
    path.write_text(
        f'[job]\nname = "mnist"\ncode = "{EXAMPLES}"\ncommand = "python3 mwms.py"\n{job}\n'
        f'[aws]\nregion = "{REGION}"\n{aws}\n{static}'
    )
    return path


def resolve_hosts(inventory: Inventory, *, page_size: int = PAGE_SIZE) -> Inventory:
    """The inventory with its EC2 instances appended as hosts, after the static [[hosts]], asking
    EC2 for `page_size` instances a page (small pages exercise pagination)."""
    pending = tuple(
        dataclasses.replace(s, settings=dataclasses.replace(s.settings, page_size=page_size))
        if isinstance(s, AwsSource)
        else s
        for s in inventory.pending
    )
    return discover_hosts(dataclasses.replace(inventory, pending=pending))
