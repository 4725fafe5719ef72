"""Hosts from EC2: the `[aws]` inventory section, and discovery of the instances it names.

`[aws]` is a host source (a plug-in, sources/base.py): parsing it is pure and runs inside
`load_inventory`; `discover` and `resolve_hosts` are the only parts that talk to AWS, and boto3 is
imported only there, so it stays an optional extra (`pip install tfdeploy[aws]`). Instances are
ordered by launch time, then instance id, so task indices are the same for `plan` and `up` as long
as the fleet is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deployer.config.inventory import (
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
from deployer.config.schema import Table, describe
from deployer.core.errors import ExitStatus, InventoryError, TfdeployError

ADDRESS_KINDS = ("public", "private")
PAGE_SIZE = 200  # describe_instances' MaxResults for one page (AWS allows 5-1000)
INSTALL_HINT = "install the AWS extra: pip install 'tfdeploy[aws]'"
METADATA_URL = "http://169.254.169.254"  # EC2's instance metadata service, as seen from a host
LAUNCHED_TAG = "tfdeploy:launched"  # on instances tfdeploy launched; the value is the job name
GROUP_TAG = "tfdeploy:group"  # the [[aws.hosts]] entry an instance was launched for
TERMINATE_AFTER = ("down", "job-end", "never")
MAX_LAUNCH = 16  # instances one `up` may launch unless [aws] max_launch says otherwise
IDLE_MINUTES = 60.0
LAUNCH_FILTERS = ("instance-type",)  # besides tag:*, what a group that launches may filter by


class DiscoveryError(TfdeployError):
    """EC2 could not be asked (no boto3, no credentials, API refused): nothing was contacted."""

    exit_status = ExitStatus.USAGE


@dataclass(frozen=True)
class Launch:
    """A group's `launch` table: what `up` starts when fewer than `count` instances run."""

    count: int
    instance_type: str | None  # None: the launch template's
    image_id: str | None
    launch_template: str | None  # "lt-..." (an id) or a name
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    spot: bool = False
    max_price: str | None = None  # spot only; None: up to the on-demand price
    iam_instance_profile: str | None = None  # a name, or an ARN
    root_volume_gb: int | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)  # extra tags
    terminate_after: str = "down"  # down | job-end | never
    idle_minutes: float = IDLE_MINUTES  # 0: never shut down for idleness
    idle_command: str | None = None  # how the host stops itself; None: shutdown (via sudo -n)

    @property
    def market(self) -> str:
        if not self.spot:
            return "on-demand"
        return f"spot, max ${self.max_price}/h" if self.max_price else "spot"


@dataclass(frozen=True)
class HostGroup:
    """One `[[aws.hosts]]` entry: which instances, how to reach them, and what each one runs."""

    filters: dict[str, tuple[str, ...]]
    ssh_address: str  # public | private
    tf_address: str  # public | private
    settings: HostSettings  # tasks, GPUs, ports, ssh...: read exactly as for [[hosts]]
    key: str  # "aws.hosts[0]"
    launch: Launch | None = None

    def describe_filters(self) -> str:
        return ", ".join(f"{k}={'|'.join(v)}" for k, v in self.filters.items())

    def launch_tags(self, job: str) -> dict[str, str]:
        """Tags a launched instance gets: the filters' own (so discovery finds it), then ours."""
        tags = {k[len("tag:") :]: v[0] for k, v in self.filters.items() if k.startswith("tag:")}
        extra = self.launch.tags if self.launch else {}
        return {"Name": f"tfdeploy-{job}", **extra, **tags, LAUNCHED_TAG: job, GROUP_TAG: self.key}


@dataclass(frozen=True)
class AwsSettings:
    """The `[aws]` host source: which instances to look for, found by `discover` (I/O)."""

    region: str | None
    profile: str | None
    groups: tuple[HostGroup, ...]
    job: str = ""  # the job's name: launched instances are tagged with it
    key: str = "aws"
    page_size: int = PAGE_SIZE
    max_launch: int = MAX_LAUNCH
    metadata_url: str = METADATA_URL  # how spot hosts reach their metadata service
    launch_timeout: float = 600.0  # running, host keys in the console, SSH answering

    def discover(self, file: str, *, preview: bool = False) -> Discovered:
        return _discover_all(self, file, preview)

    @property
    def launches(self) -> bool:
        return any(g.launch for g in self.groups)


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

    def address(self, kind: str) -> str | None:
        return self.public_ip if kind == "public" else self.private_ip

    @property
    def planned(self) -> bool:
        """A stand-in for an instance `up` will launch: `plan` shows it, nothing contacts it."""
        return self.launched is None


# ---- parsing (pure) --------------------------------------------------------------------------


def parse_aws(t: Table, context: SourceContext) -> Sourced:
    """`[aws]`: pure; its hosts are found later, when `discover_hosts` calls `discover`."""
    region = t.string("region")
    profile = t.string("profile")
    groups = []
    for g in t.table_list("hosts", required=True):
        filters = _filters(g)
        groups.append(
            HostGroup(
                filters=filters,
                ssh_address=g.choice("ssh_address", ADDRESS_KINDS, "private"),
                tf_address=g.choice("tf_address", ADDRESS_KINDS, "private"),
                settings=parse_host_settings(g, context),
                key=g.path,
                launch=_launch(g, filters) if g.has("launch") else None,
            )
        )
        g.finish()
    settings = AwsSettings(
        region=region,
        profile=profile,
        groups=tuple(groups),
        job=context.job.name,
        max_launch=t.integer("max_launch", MAX_LAUNCH, minimum=1, maximum=1000),
        metadata_url=_url(t, "metadata_url", METADATA_URL),
        launch_timeout=t.number("launch_timeout", 600.0, minimum=1.0) or 600.0,
    )
    t.finish()
    return Sourced(pending=settings)


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


def _launch(g: Table, filters: dict[str, tuple[str, ...]]) -> Launch:
    """`launch = {...}`: checked against the group's filters, which must find what it starts."""
    t = g.sub_table("launch")
    template = t.string("launch_template")
    image = t.string("image_id")
    if (template is None) == (image is None):
        t.fail("image_id", "expected exactly one of image_id and launch_template")
    kind = t.string("instance_type", required=template is None)
    _check_launch_filters(g, filters, kind)
    spot = t.boolean("spot", False)
    max_price = t.string("max_price")
    if max_price is not None and not spot:
        t.fail("max_price", "a max price applies to spot instances only: add spot = true")
    if max_price is not None and not re.fullmatch(r"\d+(\.\d+)?", max_price):
        t.fail("max_price", f'expected a price in USD per hour like "1.25", got {max_price!r}')
    volume = t.optional_integer("root_volume_gb", minimum=1, maximum=65536)
    if volume is not None and template is not None:
        t.fail("root_volume_gb", "set the root volume in the launch template instead")
    if not t.has("count"):
        t.fail("count", "expected the number of instances this group runs, e.g. count = 2")
    launch = Launch(
        count=t.integer("count", 1, minimum=1, maximum=1000),
        instance_type=kind,
        image_id=image,
        launch_template=template,
        subnet_id=t.string("subnet_id"),
        security_group_ids=t.string_list("security_group_ids"),
        key_name=t.string("key_name"),
        spot=spot,
        max_price=max_price,
        iam_instance_profile=t.string("iam_instance_profile"),
        root_volume_gb=volume,
        tags=_launch_tags(t),
        terminate_after=t.choice("terminate_after", TERMINATE_AFTER, "down"),
        idle_minutes=t.number("idle_minutes", IDLE_MINUTES) or 0.0,
        idle_command=t.string("idle_command"),
    )
    t.finish()
    return launch


def _check_launch_filters(g: Table, filters: dict[str, tuple[str, ...]], kind: str | None) -> None:
    """Instances the group launches must match its own filters, or no `plan` would find them."""
    table = g.sub_table("filters")
    if not any(name.startswith("tag:") for name in filters):
        g.fail(
            "filters",
            "a group that launches instances needs a tag filter (they are tagged with it)",
            hint='e.g. filters = { "tag:tfdeploy-job" = "mnist", "tag:tfdeploy-role" = "worker" }',
        )
    for name, values in filters.items():
        if name.startswith("tag:") and len(values) > 1:
            table.fail(name, "a group that launches instances needs one value per tag filter")
        elif not name.startswith("tag:") and name not in LAUNCH_FILTERS:
            table.fail(
                name,
                "a group that launches instances may filter only by tags and instance-type "
                "(an instance it launches must match every filter)",
            )
        elif name == "instance-type" and kind is not None and values != (kind,):
            table.fail(name, f"launch.instance_type is {kind!r}: the filter would not find it")


def _launch_tags(t: Table) -> dict[str, str]:
    tags = t.string_map("tags")
    for name in tags:
        if name.lower().startswith(("aws:", "tfdeploy:")):
            t.fail(f"tags.{name}", "tags starting with aws: or tfdeploy: are reserved")
    return tags


def _url(t: Table, key: str, default: str) -> str:
    value = t.string(key, default) or default
    if not re.fullmatch(r"http://[A-Za-z0-9.\-\[\]:]+", value.rstrip("/")):
        t.fail(key, f"expected an http:// base URL like {default!r}, got {value!r}")
    return value.rstrip("/")


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


def _discover_all(settings: AwsSettings, file: str, preview: bool) -> Discovered:
    """Every group's running instances, as hosts; an instance may belong to one group only.

    A group that launches may have fewer than its count (even none) running: `up` launches the
    rest; with `preview`, stand-ins for them are listed after the running ones.
    """
    client = client_for(settings)
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
    return Discovered(hosts=tuple(hosts), instances=tuple(instances))


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


def client_for(settings: AwsSettings) -> Any:
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
    )


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
