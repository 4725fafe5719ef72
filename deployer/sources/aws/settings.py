"""The `[aws]` table as data: which instances to look for, how to reach them, what to launch.

Parsing is pure and runs inside `load_inventory`; nothing here talks to AWS.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from deployer.config.inventory import parse_host_settings
from deployer.config.model import HostSettings
from deployer.config.schema import Table, describe
from deployer.config.sources import ANY_TIME, SourceContext
from deployer.core.errors import ExitStatus, TfdeployError

ADDRESS_KINDS = ("public", "private")
PAGE_SIZE = 200  # describe_instances' MaxResults for one page (AWS allows 5-1000)
# The distribution is `tfdeploy-cluster` (PyPI's `tfdeploy` is an unrelated project).
INSTALL_HINT = (
    "install the AWS extra: pip install 'tfdeploy-cluster[aws]' "
    "(in a checkout of tfdeploy: pip install -e '.[aws]')"
)
METADATA_URL = "http://169.254.169.254"  # EC2's instance metadata service, as seen from a host
LAUNCHED_TAG = "tfdeploy:launched"  # on instances tfdeploy launched; the value is the job name
GROUP_TAG = "tfdeploy:group"  # the [[aws.hosts]] entry an instance was launched for
TERMINATE_AFTER = ANY_TIME  # a launch group's terminate_after: one of these
MAX_LAUNCH = 16  # instances one `up` may launch unless [aws] max_launch says otherwise
IDLE_MINUTES = 60.0
LAUNCH_FILTERS = ("instance-type",)  # besides tag:*, what a group that launches may filter by
LINUX = "Linux/UNIX"  # EC2's PlatformDetails of a plain Linux instance: the one tfdeploy prices


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
    max_cost: float | None = None  # USD: a run stops when its instances cost this much

    @property
    def launches(self) -> bool:
        return any(g.launch for g in self.groups)


# ---- parsing (pure) ------------------------------------------------------------------------


def parse_settings(t: Table, context: SourceContext) -> AwsSettings:
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
        max_cost=_max_cost(t),
    )
    t.finish()
    return settings


def _max_cost(t: Table) -> float | None:
    """`max_cost = 25.0`: USD above 0, what the run's instances may cost it (docs/aws.md)."""
    value = t.number("max_cost", None)
    if value is not None and value <= 0:
        t.fail(
            "max_cost",
            f"expected what the run may cost in USD, above 0 (e.g. max_cost = 25.0), got {value:g}",
            hint="leave max_cost out for no cap",
        )
    return value


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
