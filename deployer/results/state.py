"""Run ids and the local record of runs, so `down/status/logs RUN_ID` know which hosts to ask.

The record lists the hosts the run was pushed to, with how they were reached (no task, no env:
nothing secret), so a run is found on every one of its hosts after the inventory dropped some.
The hosts stay the source of truth for what runs: losing this directory only means naming the
inventory again (and then each host's own record of the run names the hosts it lacks).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.config.model import Host, SSHSettings
from deployer.core.errors import UsageError
from deployer.core.statedir import state_dir

if TYPE_CHECKING:
    from deployer.config.plan import Plan

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def new_run_id(job: str, now: float | None = None) -> str:
    """<job>-<UTC timestamp>-<4 hex>: sortable by time, unique when two people start at once."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{job}-{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunHost:
    """One host of a run as `up` reached it: enough to reach it again, nothing secret."""

    name: str
    address: str
    transport: str
    python: str
    workdir: str
    ssh: SSHSettings

    @classmethod
    def of(cls, host: Host) -> RunHost:
        return cls(host.name, host.address, host.transport, host.python, host.workdir, host.ssh)

    def host(self) -> Host:
        """A Host to connect to (no tasks: `down`, `status` and `logs` only ask its agent)."""
        return Host(
            name=self.name,
            address=self.address,
            tf_address=self.address,
            port=0,
            gpus=0,
            share_gpus=False,
            transport=self.transport,
            python=self.python,
            workdir=self.workdir,
            ssh=self.ssh,
            tasks=(),
        )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunHost:
        ssh = dict(d["ssh"])
        ssh["expected_keys"] = tuple(ssh.get("expected_keys") or ())
        return cls(**{**d, "ssh": SSHSettings(**ssh)})


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    inventory: str  # absolute path of the inventory the run was started from
    job: str
    created: float
    detached: bool
    hosts: tuple[RunHost, ...] = ()  # every host the run was pushed to (empty: an older record)

    @classmethod
    def of(cls, plan: Plan, run_id: str, *, detached: bool) -> RunRecord:
        inventory = str(plan.inventory.path.resolve())
        hosts = tuple(RunHost.of(h) for h in plan.hosts)
        return cls(run_id, inventory, plan.job.name, time.time(), detached, hosts)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        hosts = tuple(RunHost.from_json(h) for h in d.get("hosts") or ())
        return cls(**{**d, "hosts": hosts})


def controller_name() -> str:
    """user@machine of this controller: hosts show it as whose run holds their ports."""
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return socket.gethostname()


def save(record: RunRecord) -> None:
    folder = state_dir() / "runs"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = folder / f".{record.run_id}.json.part"
    tmp.write_text(json.dumps(dataclasses.asdict(record)), encoding="utf-8")
    tmp.replace(folder / f"{record.run_id}.json")


def load(run_id: str) -> RunRecord | None:
    if not RUN_ID.match(run_id):
        raise UsageError(f"{run_id!r} is not a run id or an inventory file")
    path = state_dir() / "runs" / f"{run_id}.json"
    try:
        return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError):
        return None
