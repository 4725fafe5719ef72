"""`up` launches the missing EC2 instances (moto) and deploys onto them (lab hosts), host keys
checked against the instances' console output; `down --terminate` ends what it launched.

moto stands in for EC2 and the lab hosts for the instances' machines: a launched instance gets
the private IP of a free lab host (moto's subnet allocator hands them out in order), and its
console output shows that host's real SSH key fingerprints, as cloud-init prints them.
"""

from __future__ import annotations

import ipaddress
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
import pytest

from deployer.sources.aws.settings import LAUNCHED_TAG
from tests.fakes.imds import Imds
from tests.lab import Lab
from tests.lab.inventory import toml_value
from tests.support.aws import REGION, cli, described, launch

pytestmark = [pytest.mark.lab, pytest.mark.isolated]
HELLO = 'import os\nprint(os.environ["TFDEPLOY_TASK"], "on", os.uname().nodename)\n'


@dataclass
class FakeFleet:
    """EC2 (moto) whose new instances land on lab hosts, with cloud-init style consoles."""

    ec2: Any
    lab: Lab
    subnet: str
    free: list[str]  # lab addresses the next launched instances get, in order
    consoles: dict[str, str] = field(default_factory=dict)  # private IP -> console text

    def fingerprints(self, address: str) -> list[str]:
        keys = paramiko.HostKeys(str(self.lab.known_hosts)).lookup(address) or {}
        return [k.fingerprint for k in keys.values()]

    def cloud_init(self, address: str, fingerprints: list[str] | None = None) -> None:
        prints = self.fingerprints(address) if fingerprints is None else fingerprints
        lines = "".join(f"ec2: 256 {f} root@ip-{address} (KEY)\n" for f in prints)
        self.consoles[address] = (
            "Cloud-init v. 24.1 running 'modules:final'\n"
            "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"{lines}ec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        )


@pytest.fixture
def fleet(lab: Lab, ec2: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFleet]:
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/16", strict=False)
    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=str(network))["Subnet"]["SubnetId"]
    fake = FakeFleet(ec2, lab, subnet, [h.address for h in lab.hosts[1:4]])
    # Imported here: moto's EC2 models take a second to import, which every collecting worker
    # of the fast tier would pay for tests it deselects.
    from moto.core.responses import ActionResult
    from moto.ec2.models.subnets import Subnet
    from moto.ec2.responses.general import General
    from moto.ec2.utils import Base64EncodedString

    def lab_address(self: Subnet, instance: Any) -> str:
        address = fake.free.pop(0)
        self._subnet_ips[address] = instance
        return address

    def console(self: General) -> ActionResult:
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = fake.consoles.get(instance.private_ip, "booting\n")
        return ActionResult(
            {"InstanceId": instance.id, "Output": Base64EncodedString.from_raw_string(text)}
        )

    monkeypatch.setattr(Subnet, "get_available_subnet_ip", lab_address)
    monkeypatch.setattr(General, "get_console_output", console)
    monkeypatch.setattr("deployer.sources.aws.launch.POLL_S", 0.2)
    yield fake
    for h in lab.hosts[:4]:
        lab.kill_leftovers(h)


def write(tmp_path: Path, fleet: FakeFleet, known_hosts: Path, *, launch: str = "") -> Path:
    lab = fleet.lab
    ssh = {
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(known_hosts),
        "connect_timeout": 5,
    }
    image = fleet.ec2.describe_images(Owners=["amazon"], MaxResults=1)["Images"][0]["ImageId"]
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "hello.py").write_text(HELLO)
    path = tmp_path / "fleet.toml"
    path.write_text(
        "[job]\n"
        f'name = "labfleet"\ncode = {toml_value(str(code))}\n'
        f"command = {toml_value(lab.python + ' hello.py')}\n"
        f"python = {toml_value(lab.python)}\nrequire_tensorflow = false\n"
        "[ssh]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ssh.items()) + "[aws]\n"
        f'region = "{REGION}"\nlaunch_timeout = 30\n'
        "[[aws.hosts]]\n"
        'filters = { "tag:tfdeploy-job" = "labfleet", "tag:tfdeploy-role" = "worker" }\n'
        'ssh_address = "private"\ntf_address = "private"\ntasks = [{ role = "worker" }]\n'
        f'launch = {{ image_id = "{image}", instance_type = "c6i.large", count = 3, '
        f'subnet_id = "{fleet.subnet}", idle_minutes = 0{launch} }}\n'
    )
    return path


def known_only(tmp_path: Path, lab: Lab, address: str) -> Path:
    """A known_hosts that knows the one instance the user started, not the ones up launches."""
    keys = paramiko.HostKeys(str(lab.known_hosts))
    path = tmp_path / "known_hosts"
    path.write_text(
        "".join(
            f"{address} {name} {key.get_base64()}\n"
            for name, key in (keys.lookup(address) or {}).items()
        )
    )
    return path


def running_of_job(ec2: Any) -> list[str]:
    reply = ec2.describe_instances(
        Filters=[
            {"Name": "tag:tfdeploy-job", "Values": ["labfleet"]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return [i["InstanceId"] for r in reply["Reservations"] for i in r["Instances"]]


def test_up_launches_the_missing_instances_verifies_their_keys_and_down_terminates_them(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    first = lab.hosts[0]
    mine = launch(
        ec2,
        {"tfdeploy-job": "labfleet", "tfdeploy-role": "worker"},
        SubnetId=fleet.subnet,
        PrivateIpAddress=first.address,
    )
    for h in lab.hosts[1:3]:
        fleet.cloud_init(h.address)
    known = known_only(tmp_path, lab, first.address)
    path = write(tmp_path, fleet, known)

    code, out, err = cli("up", str(path))
    assert code == 0, f"{out}\n{err}"
    launched = [i for i in running_of_job(ec2) if i != mine]
    assert len(launched) == 2
    assert re.search(r"launched 2 x c6i.large \(on-demand\) for aws.hosts\[0\]: i-\w+, i-\w+", out)
    by_ip = {i["PrivateIpAddress"]: i for i in described(ec2, launched)}
    assert set(by_ip) == {lab.hosts[1].address, lab.hosts[2].address}
    for instance in by_ip.values():
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[LAUNCHED_TAG] == "labfleet" and tags["tfdeploy-role"] == "worker"
    # Each task ran on the machine its instance stands for; the new keys are in known_hosts now.
    ran = re.findall(r"^worker:\d@(i-\w+) +\| worker:\d on (\S+)$", out, re.M)
    ips = {i["InstanceId"]: i["PrivateIpAddress"] for i in described(ec2, [mine, *launched])}
    hostnames = {h.address: h.hostname for h in lab.hosts}
    assert sorted(ran) == sorted((i, hostnames[ip]) for i, ip in ips.items()), out
    recorded = paramiko.HostKeys(str(known))
    for h in lab.hosts[1:3]:
        assert [k.fingerprint for k in (recorded.lookup(h.address) or {}).values()] == (
            fleet.fingerprints(h.address)
        )

    code, out, err = cli("down", str(path), "--terminate")
    assert code == 0, f"{out}\n{err}"
    assert running_of_job(ec2) == [mine]  # only the instance tfdeploy launched itself is gone
    assert f"terminated 2 instances tfdeploy launched: {', '.join(sorted(launched))}" in out
    for h in lab.hosts[:3]:
        assert not lab.leftovers(h), lab.leftovers(h)


def test_a_key_not_in_the_console_output_is_refused_and_what_was_launched_is_terminated(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    fleet.cloud_init(lab.hosts[1].address)
    fleet.cloud_init(lab.hosts[2].address)
    fleet.cloud_init(lab.hosts[3].address, ["SHA256:Zm9yZ2VkIGtleSBmaW5nZXJwcmludA"])
    known = tmp_path / "known_hosts"
    path = write(tmp_path, fleet, known, launch=', terminate_after = "never"')

    code, out, err = cli("up", str(path))
    assert code == 3, f"{out}\n{err}"
    assert "is not one its EC2 console output lists (SHA256:Zm9yZ2VkIGtleSBmaW5nZXJwcmludA)" in err
    assert "refusing to connect (possible man-in-the-middle)" in err
    assert "terminated the 3 instances this up launched" in out
    assert running_of_job(ec2) == []
    assert "Traceback" not in err
    for h in lab.hosts[1:4]:
        assert not lab.leftovers(h), lab.leftovers(h)


# ---- spot instances: interruption notices, and replacement under restart-job -----------------

SPOT_JOB = """\
import os, signal, sys, time
attempt = os.environ["TFDEPLOY_ATTEMPT"]
print(os.environ["TFDEPLOY_TASK"], "attempt", attempt, "on", os.uname().nodename, flush=True)
def checkpoint(signum, frame):
    print("SIGTERM: saving a checkpoint", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, checkpoint)
if attempt == "0":
    time.sleep(120)
"""


@pytest.fixture
def imds(lab: Lab) -> Iterator[Imds]:
    """The metadata service stand-in, on this machine's address on the lab's bridge."""
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/24", strict=False)
    with Imds(str(network.network_address + 1)) as stand_in:
        yield stand_in


def spot_inventory(tmp_path: Path, fleet: FakeFleet, imds: Imds, job: str = "") -> Path:
    path = write(tmp_path, fleet, tmp_path / "known_hosts", launch=", spot = true, count = 2")
    text = path.read_text().replace(", count = 3", "")
    text = text.replace("require_tensorflow = false\n", f"require_tensorflow = false\n{job}")
    text = text.replace(
        "launch_timeout = 30\n", f'launch_timeout = 30\nmetadata_url = "{imds.url}"\n'
    )
    path.write_text(text)
    (tmp_path / "code" / "hello.py").write_text(SPOT_JOB)
    return path


def test_a_spot_notice_stops_the_task_in_time_and_the_run_ends_preempted(
    fleet: FakeFleet, imds: Imds, tmp_path: Path
) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    for h in lab.hosts[1:3]:
        fleet.cloud_init(h.address)
    doomed = lab.hosts[2]
    at = imds.notice(seconds_from_now=40, only=doomed.address)  # its machine goes in 40 s
    path = spot_inventory(tmp_path, fleet, imds)

    code, out, err = cli("up", str(path))
    assert code == 1, f"{out}\n{err}"
    (instance,) = [
        i for i in described(ec2, running_of_job(ec2)) if i["PrivateIpAddress"] == doomed.address
    ]
    assert instance["InstanceLifecycle"] == "spot"
    victim = instance["InstanceId"]
    assert re.search(rf"worker:\d@{victim} was preempted \(preempted: its spot instance got", err)
    notice = re.search(
        r"spot interruption notice \(terminate at (\S+)\): SIGTERM now, SIGKILL in (\d+) s", out
    )
    assert notice, out
    grace = int(notice.group(2))
    # Time left minus the 15 s margin, from when the supervisor read the notice: at most 25 s,
    # and still some (how soon a loaded host reads it is a timing claim, not this test's).
    assert 0 < grace <= 40 - 15, grace
    assert re.search(rf"^worker:\d@{victim} +\| SIGTERM: saving a checkpoint$", out, re.M)
    assert imds.count("PUT", "/latest/api/token") >= 2  # both spot hosts asked
    assert at > 0
    cli("down", str(path), "--terminate")
    for h in lab.hosts[1:3]:
        assert not lab.leftovers(h), lab.leftovers(h)


def test_restart_job_replaces_a_preempted_host_and_the_job_finishes(
    fleet: FakeFleet, imds: Imds, tmp_path: Path
) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    for h in lab.hosts[1:4]:
        fleet.cloud_init(h.address)
    doomed = lab.hosts[2]
    imds.notice(seconds_from_now=30, only=doomed.address)
    job = 'on_failure = "restart-job"\nmax_restarts = 1\nrestart_backoff = 0\n'
    path = spot_inventory(tmp_path, fleet, imds, job)

    code, out, err = cli("up", str(path))
    assert code == 0, f"{out}\n{err}"
    ips = {i["InstanceId"]: i["PrivateIpAddress"] for i in described(ec2, running_of_job(ec2))}
    assert sorted(ips.values()) == sorted([lab.hosts[1].address, lab.hosts[3].address])
    new = next(i for i, ip in ips.items() if ip == lab.hosts[3].address)
    old = re.search(
        r"launched 1 x c6i.large \(spot\) for aws.hosts\[0\] to replace (i-\w+): " + new, out
    )
    assert old, out
    assert f"{new} replaces {old.group(1)}: same tasks, same indices" in out
    # The task the gone host ran runs again, same name, on the new machine, as attempt 1.
    there = re.escape(lab.hosts[3].hostname)
    moved = re.search(rf"^(worker:\d)@{new} \[attempt 1\] +\| \1 attempt 1 on {there}$", out, re.M)
    assert moved, out
    assert "job succeeded" in out
    cli("down", str(path), "--terminate")
    assert running_of_job(ec2) == []
    for h in lab.hosts[1:4]:
        assert not lab.leftovers(h), lab.leftovers(h)


@pytest.mark.parametrize("job", ["succeeds", "setup fails"])
def test_a_launched_host_shuts_itself_down_after_idle_minutes(
    fleet: FakeFleet, tmp_path: Path, job: str
) -> None:
    """Also when `up` failed before it armed the idle stop: a launched machine whose job never
    started must not run (and cost) until someone remembers it."""
    lab = fleet.lab
    host = lab.hosts[1]
    fleet.cloud_init(host.address)
    standin = Path(tempfile.mkdtemp(dir=lab.dir))  # lab.dir: seen by every lab host
    calls = standin / "calls"
    (standin / "shutdown").write_text(f'#!/bin/sh\necho "$(uname -n) $*" >> {calls}\n')
    (standin / "shutdown").chmod(0o755)
    command = f"PATH={standin}:$PATH shutdown -h now"
    path = write(tmp_path, fleet, tmp_path / "known_hosts", launch=", count = 1")
    text = path.read_text().replace("count = 3, ", "")
    text = text.replace(
        "idle_minutes = 0", f"idle_minutes = 0.05, idle_command = {toml_value(command)}"
    )
    if job == "setup fails":
        text = text.replace(
            "require_tensorflow = false\n", 'require_tensorflow = false\nsetup = ["exit 3"]\n'
        )
    path.write_text(text)

    code, out, err = cli("up", str(path))
    if job == "succeeds":
        assert code == 0, f"{out}\n{err}"
        assert "idle stop: 1 launched host shut down after 0.05 min without a running task" in out
    else:
        assert code == 3 and "setup failed (exit code 3)" in err, f"{out}\n{err}"
    deadline = time.monotonic() + 20
    while not calls.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert calls.read_text() == f"{host.hostname} -h now\n"  # that host, once
    assert not lab.leftovers(host), lab.leftovers(host)  # the watchdog ended with its shutdown
    cli("down", str(path), "--terminate")


def test_terminate_after_job_end_terminates_when_up_ends(fleet: FakeFleet, tmp_path: Path) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    fleet.cloud_init(lab.hosts[1].address)
    path = write(tmp_path, fleet, tmp_path / "known_hosts", launch=', terminate_after = "job-end"')
    path.write_text(path.read_text().replace("count = 3", "count = 1"))

    code, out, err = cli("up", str(path))
    assert code == 0, f"{out}\n{err}"
    (launched,) = re.findall(r"for aws.hosts\[0\]: (i-\w+)", out)
    assert f"terminated 1 instance tfdeploy launched: {launched}" in out
    assert running_of_job(ec2) == []
    assert not lab.leftovers(lab.hosts[1]), lab.leftovers(lab.hosts[1])


@pytest.mark.parametrize("host_keys", ["strict", "accept-new"])
def test_a_console_without_fingerprints_falls_back_only_when_the_user_chose_accept_new(
    fleet: FakeFleet, tmp_path: Path, host_keys: str
) -> None:
    lab, ec2 = fleet.lab, fleet.ec2
    host = lab.hosts[1]  # its console never prints the fingerprints (cloud-init not run)
    known = tmp_path / "known_hosts"
    path = write(tmp_path, fleet, known)
    text = path.read_text().replace("count = 3", "count = 1")
    text = text.replace("launch_timeout = 30", "launch_timeout = 4")
    text = text.replace(
        "connect_timeout = 5\n", f'connect_timeout = 5\nhost_keys = "{host_keys}"\n'
    )
    path.write_text(text)

    code, out, err = cli("up", str(path))
    if host_keys == "strict":
        assert code == 3, f"{out}\n{err}"
        assert re.search(
            r"i-\w+ still waiting to print host keys when aws.launch_timeout ran out", err
        )
        assert "terminated the 1 instance this up launched" in out
        assert running_of_job(ec2) == [] and not known.exists()
    else:
        assert code == 0, f"{out}\n{err}"
        assert re.search(
            r"warning: no SSH host key fingerprints in the console output of i-\w+", out
        )
        assert paramiko.HostKeys(str(known)).lookup(host.address)  # recorded on first use
        cli("down", str(path), "--terminate")
    assert not lab.leftovers(host), lab.leftovers(host)
