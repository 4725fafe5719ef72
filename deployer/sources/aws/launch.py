"""Bringing an `[aws]` fleet up and taking it away: launch what is missing, terminate what we made.

discovery.py finds instances; this module changes them, with the plumbing every launching
source shares (deployer/sources/launching.py: the SSH wait, key pinning, ending on failure and
when due). Everything it launches is tagged with the group's filter tags (so the next `plan`
finds it) and with `tfdeploy:launched = <job>` (so `down --terminate` ends only instances
tfdeploy made, never ones it merely discovered). A new instance's SSH host key is checked
against the fingerprints cloud-init prints to its console, the one channel to the machine that
does not go through the network being verified.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from deployer.config.model import Host
from deployer.config.sources import Discovered, Say
from deployer.core.errors import ExitStatus, InventoryError, TfdeployError
from deployer.core.text import plural
from deployer.sources import launching
from deployer.sources.aws import ends
from deployer.sources.aws.discovery import (
    Instance,
    client_for,
    discover,
    discover_all,
    host_of,
    instance_of,
)
from deployer.sources.aws.settings import (
    GROUP_TAG,
    LAUNCHED_TAG,
    AwsSettings,
    DiscoveryError,
    HostGroup,
    Launch,
)

POLL_S = 2.0  # between describe_instances / get_console_output calls while waiting
_FINGERPRINTS = re.compile(
    r"-----BEGIN SSH HOST KEY FINGERPRINTS-----(.*?)-----END SSH HOST KEY FINGERPRINTS-----",
    re.S,
)
_SHA256 = re.compile(r"\bSHA256:[A-Za-z0-9+/]+")
# What each call needs, for the error when EC2 refuses it.
_ACTIONS = {
    "run_instances": "ec2:RunInstances and ec2:CreateTags (and iam:PassRole for a profile)",
    "terminate_instances": "ec2:TerminateInstances",
    "get_console_output": "ec2:GetConsoleOutput",
    "describe_instances": "ec2:DescribeInstances",
    "describe_images": "ec2:DescribeImages",
}


class LaunchError(TfdeployError):
    """EC2 would not launch or terminate what the inventory asks for."""

    exit_status = ExitStatus.UNREACHABLE


@dataclass(frozen=True)
class Order:
    """One group's launch: how many instances, and the run_instances request that makes them."""

    group: HostGroup
    count: int
    request: dict[str, Any]

    def describe(self) -> str:
        launch = self.group.launch
        assert launch is not None
        kind = launch.instance_type or f"template {launch.launch_template}"
        return f"{self.count} x {kind} ({launch.market}) for {self.group.key}"


# ---- up: launch what is missing --------------------------------------------------------------


def provision(
    settings: AwsSettings, file: str, say: Say, *, clock: Any = time.monotonic
) -> Discovered:
    """Launches each group's missing instances, waits until they answer SSH with the host key
    their console printed, and returns every group's hosts, as discovery would.

    Nothing is launched unless every group's launch passes EC2's dry run and the total stays
    within [aws] max_launch. Instances launched here are terminated again if waiting fails:
    they hold nothing yet, and would only cost money.
    """
    client = client_for(settings)
    orders = _orders(client, settings, file)
    if not orders:
        return discover_all(settings, file)
    for order in orders:
        _dry_run(client, order)
    deadline = clock() + settings.launch_timeout
    batches: list[list[str]] = []
    with launching.ended_on_failure(_terminator(client), say, "instance") as launched:
        for order in orders:
            ids = _launch(client, order)
            say(f"launched {order.describe()}: {', '.join(ids)}")
            launched += ids
            batches.append(ids)
        lenient = [i for o, ids in zip(orders, batches, strict=True) if _lenient(o) for i in ids]
        keys = wait_ready(client, launched, deadline, say, clock=clock, trust_first=lenient)
        found = discover_all(settings, file)
        hosts = tuple(launching.expecting(h, keys.get(h.name, ())) for h in found.hosts)
        _wait_for_ssh([h for h in hosts if h.name in launched], deadline, say, clock)
    return dataclasses.replace(found, hosts=hosts)


def _terminator(client: Any) -> Any:
    return lambda ids: _terminate(client, ids)


def _terminate(client: Any, ids: Sequence[str]) -> None:
    """Terminates `ids`, and keeps when: EC2 forgets a terminated instance within about an
    hour, and a run's cost needs its end later (ends.py)."""
    _call(client, "terminate_instances", InstanceIds=list(ids))
    ends.note(dict.fromkeys(ids, time.time()))


def _wait_for_ssh(hosts: Sequence[Host], deadline: float, say: Say, clock: Any) -> None:
    # POLL_S read at each call: the lab tests shorten it on this module.
    launching.wait_for_ssh(
        hosts, deadline, say, clock=clock, poll=POLL_S, wait_name="aws.launch_timeout"
    )


def _lenient(order: Order) -> bool:
    return order.group.settings.ssh.host_keys == "accept-new"


def _orders(client: Any, settings: AwsSettings, file: str) -> list[Order]:
    orders = []
    for group in settings.groups:
        if group.launch is None:
            continue
        running = len(discover(client, group, page_size=settings.page_size))
        if running < group.launch.count:
            count = group.launch.count - running
            orders.append(Order(group, count, launch_request(client, group, count, settings.job)))
    total = sum(o.count for o in orders)
    if total > settings.max_launch:
        wanted = "; ".join(o.describe() for o in orders)
        raise InventoryError(
            file,
            "aws.max_launch",
            f"up would launch {total} instances ({wanted}), more than max_launch = "
            f"{settings.max_launch}",
            hint="raise aws.max_launch if that many is really meant",
        )
    return orders


def launch_request(client: Any, group: HostGroup, count: int, job: str) -> dict[str, Any]:
    """run_instances' arguments for `count` instances of `group` (pure but for the AMI's root
    device name, which a root volume size needs)."""
    launch = group.launch
    assert launch is not None
    tags = [{"Key": k, "Value": v} for k, v in group.launch_tags(job).items()]
    request: dict[str, Any] = {
        "MinCount": count,
        "MaxCount": count,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        # An idle stop (`shutdown` on the host) ends the instance rather than parking it:
        # stopped instances still cost their volumes, and spot instances cannot stop.
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    if launch.launch_template:
        by = (
            "LaunchTemplateId" if launch.launch_template.startswith("lt-") else "LaunchTemplateName"
        )
        request["LaunchTemplate"] = {by: launch.launch_template}
    else:
        request["ImageId"] = launch.image_id
    request.update(_placement(launch))
    if launch.root_volume_gb:
        request["BlockDeviceMappings"] = [
            {
                "DeviceName": _root_device(client, launch),
                "Ebs": {"VolumeSize": launch.root_volume_gb, "DeleteOnTermination": True},
            }
        ]
    return request


def _placement(launch: Launch) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if launch.instance_type:
        out["InstanceType"] = launch.instance_type
    if launch.subnet_id:
        out["SubnetId"] = launch.subnet_id
    if launch.security_group_ids:
        out["SecurityGroupIds"] = list(launch.security_group_ids)
    if launch.key_name:
        out["KeyName"] = launch.key_name
    if launch.iam_instance_profile:
        by = "Arn" if launch.iam_instance_profile.startswith("arn:") else "Name"
        out["IamInstanceProfile"] = {by: launch.iam_instance_profile}
    if launch.spot:
        options: dict[str, Any] = {"SpotInstanceType": "one-time"}
        if launch.max_price:
            options["MaxPrice"] = launch.max_price
        out["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return out


def _root_device(client: Any, launch: Launch) -> str:
    images = _call(client, "describe_images", ImageIds=[launch.image_id]).get("Images", [])
    if not images:
        raise LaunchError(f"image {launch.image_id} does not exist in {client.meta.region_name}")
    return str(images[0].get("RootDeviceName") or "/dev/xvda")


def _dry_run(client: Any, order: Order) -> None:
    """EC2 checks permissions and parameters without launching: DryRunOperation means yes."""
    import botocore.exceptions

    try:
        client.run_instances(**order.request, DryRun=True)
    except botocore.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "DryRunOperation":
            return
        raise _refused("run_instances", exc, f"launching {order.describe()}") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise DiscoveryError(f"could not ask EC2 to launch instances: {exc}") from None


def _launch(client: Any, order: Order) -> list[str]:
    reply = _call(client, "run_instances", **order.request)
    return [i["InstanceId"] for i in reply.get("Instances", [])]


def wait_ready(
    client: Any,
    ids: Sequence[str],
    deadline: float,
    say: Say,
    *,
    clock: Any = time.monotonic,
    trust_first: Iterable[str] = (),
) -> dict[str, tuple[str, ...]]:
    """Waits until `ids` run and their consoles show SSH host key fingerprints; returns them.

    Instances in `trust_first` (their hosts say host_keys = "accept-new") wait for the console
    half the time left at most, then go without fingerprints: accept-new stays the fallback
    only when the user chose it. Any other instance without them by `deadline` is an error.
    """
    pending = set(ids)
    say(f"waiting for {plural(len(ids), 'instance')} to run")
    while pending:
        reply = _call(client, "describe_instances", InstanceIds=sorted(pending))
        for raw in _raw_instances(reply):
            state = raw.get("State", {}).get("Name")
            if state == "running":
                pending.discard(raw["InstanceId"])
            elif state in ("shutting-down", "terminated", "stopping", "stopped"):
                reason = raw.get("StateReason", {}).get("Message", state)
                raise LaunchError(f"instance {raw['InstanceId']} ended while starting: {reason}")
        _pause(pending, deadline, clock, "to run")
    keys: dict[str, tuple[str, ...]] = {}
    lenient = set(trust_first)
    patience = clock() + (deadline - clock()) / 2
    say("reading the new instances' SSH host keys from their console output")
    while len(keys) < len(ids):
        for instance in (i for i in ids if i not in keys):
            found = console_fingerprints(client, instance)
            if found:
                keys[instance] = found
        waiting = [i for i in ids if i not in keys]
        if waiting and set(waiting) <= lenient and clock() >= patience:
            say(
                f"warning: no SSH host key fingerprints in the console output of "
                f"{', '.join(waiting)}: their keys are accepted on first use (host_keys = "
                '"accept-new")'
            )
            break
        _pause(waiting, deadline, clock, "to print host keys")
    return keys


def _pause(waiting: Iterable[str], deadline: float, clock: Any, what: str) -> None:
    waiting = sorted(waiting)
    if not waiting:
        return
    if clock() >= deadline:
        raise LaunchError(
            f"{', '.join(waiting)} still waiting {what} when aws.launch_timeout ran out",
            hint="raise [aws] launch_timeout, or look at the instance in the EC2 console",
        )
    time.sleep(POLL_S)


def console_fingerprints(client: Any, instance_id: str) -> tuple[str, ...]:
    """The SHA256 host key fingerprints cloud-init printed to the instance's console, if yet."""
    reply = _call(client, "get_console_output", InstanceId=instance_id, Latest=True)
    return parse_fingerprints(reply.get("Output") or "")


def parse_fingerprints(console: str) -> tuple[str, ...]:
    """`SHA256:...` lines between cloud-init's fingerprint markers (lines may carry `ec2: `)."""
    found: list[str] = []
    for block in _FINGERPRINTS.findall(console):
        found += [f for f in _SHA256.findall(block) if f not in found]
    return tuple(found)


# ---- down: terminate what we launched --------------------------------------------------------


def launched_instances(settings: AwsSettings) -> list[Instance]:
    """Instances tfdeploy launched for this job's groups, in any state but terminated."""
    client = client_for(settings)
    found: list[Instance] = []
    for group in settings.groups:
        if group.launch is None:
            continue
        ours = dataclasses.replace(
            group,
            filters={
                **group.filters,
                f"tag:{LAUNCHED_TAG}": (settings.job,),
                f"tag:{GROUP_TAG}": (group.key,),
            },
        )
        found += discover(client, ours, states=("pending", "running", "stopping", "stopped"))
    return found


def terminate(settings: AwsSettings, ids: Sequence[str]) -> None:
    if ids:
        _terminate(client_for(settings), ids)


# ---- EC2 calls ---------------------------------------------------------------------------------


def _call(client: Any, method: str, **kwargs: Any) -> Any:
    import botocore.exceptions

    try:
        return getattr(client, method)(**kwargs)
    except botocore.exceptions.ClientError as exc:
        raise _refused(method, exc) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise DiscoveryError(f"could not ask EC2 ({method}): {exc}") from None


def _refused(method: str, exc: Any, doing: str = "") -> LaunchError:
    error = exc.response.get("Error", {})
    code, message = error.get("Code", "?"), error.get("Message", "")
    what = f" {doing}" if doing else ""
    hint = None
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        hint = f"the credentials need {_ACTIONS.get(method, method)}"
    return LaunchError(f"EC2 refused {method}{what}: {code}: {message}", hint=hint)


def _raw_instances(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for r in reply.get("Reservations", []) for i in r.get("Instances", [])]


def terminate_launched(settings: AwsSettings, when: tuple[str, ...], say: Say) -> None:
    """Terminates what tfdeploy launched for the groups whose terminate_after is in `when`.
    Costs nothing for inventories that launch nothing."""
    groups = [(g.launch.terminate_after, g) for g in settings.groups if g.launch]

    def find(due: Sequence[HostGroup]) -> list[str]:
        return [i.id for i in launched_instances(dataclasses.replace(settings, groups=tuple(due)))]

    launching.end_due(
        when, groups, find, lambda ids: terminate(settings, ids), say, noun="instance"
    )


# ---- restart-job: a new machine for a gone one -------------------------------------------------


def replace_host(settings: AwsSettings, file: str, gone: Host, say: Say) -> Host | None:
    """Launches one instance of `gone`'s group and returns it as a host, verified like any new
    instance; terminates `gone` first if tfdeploy launched it (a preempted instance is going
    anyway; a lost one might come back and cost money beside its replacement). None when the
    group does not launch: the job then restarts on the hosts it has."""
    group = next((g for g in settings.groups if g.key == gone.key and g.launch), None)
    if group is None:
        return None
    client = client_for(settings)
    reply = _call(client, "describe_instances", InstanceIds=[gone.name])
    old = [instance_of(raw, group.key) for raw in _raw_instances(reply)]
    if any(i.ours for i in old):
        _terminate(client, [gone.name])
        say(f"terminated {gone.name}, which tfdeploy launched")
    order = Order(group, 1, launch_request(client, group, 1, settings.job))
    with launching.ended_on_failure(_terminator(client), None) as launched:
        (new_id,) = _launch(client, order)
        launched.append(new_id)
        say(f"launched {order.describe()} to replace {gone.name}: {new_id}")
        deadline = time.monotonic() + settings.launch_timeout
        lenient = [new_id] if _lenient(order) else []
        keys = wait_ready(client, [new_id], deadline, say, trust_first=lenient)
        (raw,) = _raw_instances(_call(client, "describe_instances", InstanceIds=[new_id]))
        host = launching.expecting(
            host_of(instance_of(raw, group.key), group, file, settings.metadata_url),
            keys.get(new_id, ()),
        )
        _wait_for_ssh([host], deadline, say, time.monotonic)
    return host
