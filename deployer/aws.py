"""Hosts from EC2: the `[aws]` inventory section, and discovery of the instances it names.

`[aws]` is a host source (`deployer.inventory.register_source`): parsing it is pure and runs inside
`load_inventory`; `discover` and `resolve_hosts` are the only parts that talk to AWS, and boto3 is
imported only there, so it stays an optional extra (`pip install tfdeploy[aws]`). Instances are
ordered by launch time, then instance id, so task indices are the same for `plan` and `up` as long
as the fleet is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deployer.errors import ExitStatus, InventoryError, TfdeployError
from deployer.inventory import (
    TRANSPORTS,
    Discovered,
    Host,
    HostSettings,
    Inventory,
    SourceContext,
    Sourced,
    discover_hosts,
    make_host,
    parse_host_settings,
    register_source,
)
from deployer.schema import Table, describe

ADDRESS_KINDS = ("public", "private")
PAGE_SIZE = 200  # describe_instances' MaxResults for one page (AWS allows 5-1000)
INSTALL_HINT = "install the AWS extra: pip install 'tfdeploy[aws]'"


class DiscoveryError(TfdeployError):
    """EC2 could not be asked (no boto3, no credentials, API refused): nothing was contacted."""

    exit_status = ExitStatus.USAGE


@dataclass(frozen=True)
class HostGroup:
    """One `[[aws.hosts]]` entry: which instances, how to reach them, and what each one runs."""

    filters: dict[str, tuple[str, ...]]
    ssh_address: str  # public | private
    tf_address: str  # public | private
    settings: HostSettings  # tasks, GPUs, ports, ssh...: read exactly as for [[hosts]]
    key: str  # "aws.hosts[0]"

    def describe_filters(self) -> str:
        return ", ".join(f"{k}={'|'.join(v)}" for k, v in self.filters.items())


@dataclass(frozen=True)
class AwsSettings:
    """The `[aws]` host source: which instances to look for, found by `discover` (I/O)."""

    region: str | None
    profile: str | None
    groups: tuple[HostGroup, ...]
    key: str = "aws"
    page_size: int = PAGE_SIZE

    def discover(self, file: str) -> Discovered:
        return _discover_all(self, file)


@dataclass(frozen=True)
class Instance:
    """What tfdeploy keeps of one running EC2 instance."""

    id: str
    type: str
    zone: str
    private_ip: str | None
    public_ip: str | None
    launched: datetime
    name: str | None  # the Name tag
    group: str  # key of the [[aws.hosts]] entry that matched it

    def address(self, kind: str) -> str | None:
        return self.public_ip if kind == "public" else self.private_ip


# ---- parsing (pure) --------------------------------------------------------------------------


def parse_aws(t: Table, context: SourceContext) -> Sourced:
    """`[aws]`: pure; its hosts are found later, when `discover_hosts` calls `discover`."""
    region = t.string("region")
    profile = t.string("profile")
    groups = []
    for g in t.table_list("hosts", required=True):
        groups.append(
            HostGroup(
                filters=_filters(g),
                ssh_address=g.choice("ssh_address", ADDRESS_KINDS, "private"),
                tf_address=g.choice("tf_address", ADDRESS_KINDS, "private"),
                settings=parse_host_settings(g, context),
                key=g.path,
            )
        )
        g.finish()
    t.finish()
    return Sourced(pending=AwsSettings(region=region, profile=profile, groups=tuple(groups)))


register_source("aws", parse_aws)


def _filters(g: Table) -> dict[str, tuple[str, ...]]:
    """EC2 filters: a name to one value or a list of values, e.g. "tag:role" = ["ps", "chief"]."""
    table = g.sub_table("filters", required=True)
    entries = table.entries()  # the keys are the user's filter names; each value is checked here
    if not entries:
        g.fail("filters", 'expected at least one filter, e.g. { "tag:tfdeploy-job" = "mnist" }')
    filters: dict[str, tuple[str, ...]] = {}
    for name, value in entries:
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            table.fail(name, f"expected a string or a list of strings, got {describe(value)}")
        if name == "instance-state-name":
            table.fail(name, "tfdeploy always uses running instances only; remove this filter")
        filters[name] = tuple(values)
    return filters


# ---- discovery (I/O) ---------------------------------------------------------------------------


def resolve_hosts(inventory: Inventory, *, page_size: int = PAGE_SIZE) -> Inventory:
    """The inventory with its EC2 instances appended as hosts, after the static [[hosts]].

    Returns the inventory unchanged when nothing is pending, so callers need not check.
    """
    pending = tuple(
        dataclasses.replace(s, page_size=page_size) if isinstance(s, AwsSettings) else s
        for s in inventory.pending
    )
    return discover_hosts(dataclasses.replace(inventory, pending=pending))


def _discover_all(settings: AwsSettings, file: str) -> Discovered:
    """Every group's running instances, as hosts; an instance may belong to one group only."""
    client = _client(settings)
    seen: dict[str, str] = {}
    instances: list[Instance] = []
    hosts: list[Host] = []
    for group in settings.groups:
        found = discover(client, group, page_size=settings.page_size)
        if not found:
            raise InventoryError(
                file,
                f"{group.key}.filters",
                f"no running EC2 instance in {_region(client)} matches {group.describe_filters()}",
                hint="check the tags and the region (`aws ec2 describe-instances --filters ...`)",
            )
        for instance in found:
            if instance.id in seen:
                raise InventoryError(
                    file,
                    f"{group.key}.filters",
                    f"instance {instance.id} is also matched by {seen[instance.id]}",
                    hint="make the groups' filters disjoint (e.g. a role tag per group)",
                )
            seen[instance.id] = group.key
            instances.append(instance)
            hosts.append(_host(instance, group, file))
    return Discovered(hosts=tuple(hosts), instances=tuple(instances))


def _client(settings: AwsSettings) -> Any:
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        raise DiscoveryError(
            "the inventory has an [aws] section but boto3 is not installed", hint=INSTALL_HINT
        ) from None
    try:
        session = boto3.Session(profile_name=settings.profile, region_name=settings.region)
        return session.client("ec2")
    except botocore.exceptions.ProfileNotFound:
        raise DiscoveryError(
            f"AWS profile {settings.profile!r} is not configured on this machine",
            hint="run `aws configure --profile NAME`, or remove aws.profile to use the default "
            "credential chain",
        ) from None
    except botocore.exceptions.NoRegionError:
        raise DiscoveryError(
            "no AWS region: set aws.region in the inventory (or AWS_DEFAULT_REGION)"
        ) from None


def _region(client: Any) -> str:
    return str(client.meta.region_name)


def discover(client: Any, group: HostGroup, *, page_size: int = PAGE_SIZE) -> list[Instance]:
    """Running instances matching the group's filters, by launch time then instance id."""
    import botocore.exceptions

    filters = [{"Name": k, "Values": list(v)} for k, v in group.filters.items()]
    filters.append({"Name": "instance-state-name", "Values": ["running"]})
    found: list[Instance] = []
    try:
        pages = client.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": page_size}
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    if raw.get("State", {}).get("Name") == "running":
                        found.append(_instance(raw, group.key))
    except botocore.exceptions.NoCredentialsError:
        raise DiscoveryError(
            "no AWS credentials found to discover the [aws] hosts",
            hint="set AWS_PROFILE or aws.profile, run `aws configure`, or export "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ) from None
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        raise DiscoveryError(
            f"EC2 refused describe_instances: {error.get('Code')}: {error.get('Message')}",
            hint="the credentials need ec2:DescribeInstances in the inventory's region",
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise DiscoveryError(f"could not ask EC2 for instances: {exc}") from None
    found.sort(key=lambda i: (i.launched, i.id))
    return found


def _instance(raw: dict[str, Any], group: str) -> Instance:
    tags = {t.get("Key"): t.get("Value") for t in raw.get("Tags", [])}
    return Instance(
        id=raw["InstanceId"],
        type=raw.get("InstanceType", "?"),
        zone=raw.get("Placement", {}).get("AvailabilityZone", "?"),
        private_ip=raw.get("PrivateIpAddress") or None,
        public_ip=raw.get("PublicIpAddress") or None,
        launched=raw["LaunchTime"],
        name=tags.get("Name"),
        group=group,
    )


def _host(instance: Instance, group: HostGroup, file: str) -> Host:
    addresses = {}
    for key in ("ssh_address", "tf_address"):
        kind = getattr(group, key)
        address = instance.address(kind)
        if address is None:
            raise InventoryError(
                file,
                f"{group.key}.{key}",
                f"instance {instance.id} has no {kind} IP address",
                hint='use "private" (through a bastion: [ssh] jump) or give it a public IP',
            )
        addresses[key] = address
    return make_host(
        group.settings,
        name=instance.id,
        address=addresses["ssh_address"],
        tf_address=addresses["tf_address"],
        transport=TRANSPORTS[0],
        key=group.key,
    )


def instance_rows(instances: Iterable[Instance]) -> list[tuple[str, ...]]:
    """id, Name tag, type, zone, private and public IP, group: what `plan` shows of each."""
    return [
        (i.id, i.name or "-", i.type, i.zone, i.private_ip or "-", i.public_ip or "-", i.group)
        for i in instances
    ]
