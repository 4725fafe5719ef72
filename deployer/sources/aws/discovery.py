"""Finding an `[aws]` fleet: the instances each group's filters match, as hosts, and how `plan`
shows them.

boto3 is imported only here and in launch.py, when an inventory has an `[aws]` table, so it
stays an optional extra. Instances are ordered by launch time, then instance id, so task indices
are the same for `plan` and `up` as long as the fleet is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deployer.config.inventory import TRANSPORTS, make_host
from deployer.config.model import Host
from deployer.config.sources import Discovered, SourceTable
from deployer.core.errors import InventoryError
from deployer.sources.aws.settings import (
    INSTALL_HINT,
    LAUNCHED_TAG,
    LINUX,
    PAGE_SIZE,
    AwsSettings,
    DiscoveryError,
    HostGroup,
)


@dataclass(frozen=True)
class Instance:
    """What tfdeploy keeps of one running EC2 instance."""

    id: str
    type: str
    zone: str
    private_ip: str | None
    public_ip: str | None
    launched: datetime | None  # None: not launched yet (`plan` of a group that launches)
    name: str | None  # the Name tag
    group: str  # key of the [[aws.hosts]] entry that matched it
    spot: bool = False
    ours: bool = False  # tfdeploy launched it (tagged LAUNCHED_TAG): `down --terminate` may end it
    platform: str = LINUX  # EC2's PlatformDetails: what its price is listed under
    tenancy: str = "default"  # shared hardware; "dedicated" and "host" are priced apart

    def address(self, kind: str) -> str | None:
        return self.public_ip if kind == "public" else self.private_ip

    @property
    def planned(self) -> bool:
        """A stand-in for an instance `up` will launch: `plan` shows it, nothing contacts it."""
        return self.launched is None


# ---- discovery (I/O) ---------------------------------------------------------------------


def discover_all(settings: AwsSettings, file: str, preview: bool = False) -> Discovered:
    """Every group's running instances, as hosts; an instance may belong to one group only.

    A group that launches may have fewer than its count (even none) running: `up` launches the
    rest; with `preview`, stand-ins for them are listed after the running ones.
    """
    client = client_for(settings)
    where = {"region": _region(client), "profile": settings.profile}
    seen: dict[str, str] = {}
    instances: list[Instance] = []
    hosts: list[Host] = []
    for group in settings.groups:
        found = discover(client, group, page_size=settings.page_size)
        if group.launch is not None and preview:
            found += planned(group, len(found), start=len(instances) + len(found) + 1)
        if not found and group.launch is None:
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
            hosts.append(host_of(instance, group, file, settings.metadata_url))
    table = dataclasses.replace(instances_table(instances, where), max_cost=settings.max_cost)
    return Discovered(hosts=tuple(hosts), instances=tuple(instances), table=table)


def planned(group: HostGroup, running: int, *, start: int) -> list[Instance]:
    """Stand-ins for the instances `up` would launch in `group`: what `plan` shows of them."""
    assert group.launch is not None
    missing = max(0, group.launch.count - running)
    return [
        Instance(
            id=f"launch-{start + i}",
            type=group.launch.instance_type or "(template)",
            zone="-",
            private_ip=f"launch-{start + i}",
            public_ip=f"launch-{start + i}",
            launched=None,
            name=None,
            group=group.key,
            spot=group.launch.spot,
            ours=True,
        )
        for i in range(missing)
    ]


@functools.cache
def _service_models() -> Any:
    """botocore's model loader, shared by every client this process makes: a fresh session parses
    EC2's service description (megabytes of JSON, ~0.2 s of CPU) again, and `up` makes a client
    per discovery, launch, replacement and teardown."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def _botocore_session(profile: str | None) -> Any:
    import botocore.session

    session = botocore.session.Session(profile=profile)
    session.register_component("data_loader", _service_models())
    return session


def client_for(settings: AwsSettings, service: str = "ec2", config: Any = None) -> Any:
    """A boto3 client for `service` in the settings' region and profile (`config`: botocore's
    timeouts and retries, where the caller wants its own)."""
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        raise DiscoveryError(
            "the inventory has an [aws] section but boto3 is not installed", hint=INSTALL_HINT
        ) from None
    try:
        session = boto3.Session(
            botocore_session=_botocore_session(settings.profile), region_name=settings.region
        )
        return session.client(service, config=config)
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


def discover(
    client: Any,
    group: HostGroup,
    *,
    page_size: int = PAGE_SIZE,
    states: tuple[str, ...] = ("running",),
) -> list[Instance]:
    """Instances matching the group's filters (running ones unless `states` says otherwise),
    by launch time then instance id."""
    import botocore.exceptions

    filters = [{"Name": k, "Values": list(v)} for k, v in group.filters.items()]
    filters.append({"Name": "instance-state-name", "Values": list(states)})
    found: list[Instance] = []
    try:
        pages = client.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": page_size}
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    if raw.get("State", {}).get("Name") in states:
                        found.append(instance_of(raw, group.key))
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


def instance_of(raw: dict[str, Any], group: str) -> Instance:
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
        spot=raw.get("InstanceLifecycle") == "spot",
        ours=LAUNCHED_TAG in tags,
        platform=platform_of(raw),
        tenancy=str(raw.get("Placement", {}).get("Tenancy") or "default"),
    )


def platform_of(raw: dict[str, Any]) -> str:
    """EC2's PlatformDetails ("Linux/UNIX", "Windows", "Red Hat Enterprise Linux"...); where it
    is missing (EC2 stand-ins), `Platform`, which EC2 sets to "windows" for Windows only."""
    details = raw.get("PlatformDetails")
    if isinstance(details, str) and details:
        return details
    return "Windows" if raw.get("Platform") == "windows" else LINUX


def host_of(instance: Instance, group: HostGroup, file: str, metadata_url: str) -> Host:
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
    host = make_host(
        group.settings,
        name=instance.id,
        address=addresses["ssh_address"],
        tf_address=addresses["tf_address"],
        transport=TRANSPORTS[0],
        key=group.key,
    )
    watch = metadata_url if instance.spot else None
    host = dataclasses.replace(host, interruption_url=watch)
    if group.launch and instance.ours:
        launch = group.launch
        host = dataclasses.replace(
            host, idle_minutes=launch.idle_minutes, idle_command=launch.idle_command
        )
    return host


def instance_rows(instances: Iterable[Instance]) -> list[tuple[str, ...]]:
    """id, Name tag, type, market, zone, private and public IP, group: `plan`'s view of each."""
    return [_row(i) for i in instances]


def _row(i: Instance) -> tuple[str, ...]:
    market = "spot" if i.spot else "on-demand"
    if i.planned:
        return ("(to launch)", "-", i.type, market, "-", "-", "-", i.group)
    mark = " (launched)" if i.ours else ""
    ips = (i.private_ip or "-", i.public_ip or "-")
    return (i.id + mark, i.name or "-", i.type, market, i.zone, *ips, i.group)


COLUMNS = ("instance", "Name", "type", "market", "zone", "private IP", "public IP", "group")


def instances_table(
    instances: Sequence[Instance], where: Mapping[str, str | None] | None = None
) -> SourceTable:
    """How `plan` shows the fleet: one row per instance in host order, and the same as JSON
    (each document with the region and profile it was found with: `up` keeps the documents
    in the run's facts, and a run's cost is asked with them: deployer/sources/aws/cost.py)."""
    to_launch = sum(1 for i in instances if i.planned)
    title = f"{len(instances)} EC2 instances (running, from [aws])"
    if to_launch:
        running = len(instances) - to_launch
        title = f"{len(instances)} EC2 instances ({running} running, {to_launch} to launch by `up`)"
    return SourceTable(
        title=title,
        columns=COLUMNS,
        rows=tuple(instance_rows(instances)),
        json_key="instances",
        documents=tuple(_document(i) | dict(where or {}) for i in instances),
        to_launch=to_launch,
    )


def _document(i: Instance) -> dict[str, Any]:
    return {
        "id": i.id,
        "name": i.name,
        "type": i.type,
        "zone": i.zone,
        "private_ip": i.private_ip,
        "public_ip": i.public_ip,
        "launched": i.launched.isoformat() if i.launched else None,
        "group": i.group,
        "spot": i.spot,
        "by_tfdeploy": i.ours,
        "platform": i.platform,
        "tenancy": i.tenancy,
    }
