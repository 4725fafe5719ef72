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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.config.model import Host, SSHSettings, Via
from deployer.core import boundedjson
from deployer.core.errors import UsageError
from deployer.results.runstore import RunFolder, runs_root

if TYPE_CHECKING:
    from deployer.config.plan import Plan

# \Z, not $: `$` also matches before a final newline, which no run id holds.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


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
    via: Via | None = None  # a scheduler's node: its login and launcher (the allocation's id)

    @classmethod
    def of(cls, host: Host) -> RunHost:
        return cls(
            host.name, host.address, host.transport, host.python, host.workdir, host.ssh, host.via
        )

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
            via=self.via,
        )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunHost:
        ssh = dict(d["ssh"])
        ssh["expected_keys"] = tuple(ssh.get("expected_keys") or ())
        via = d.get("via")
        if via is not None:
            via = Via(via["login"], tuple(via["launcher"]))
        return cls(**{**d, "ssh": SSHSettings(**ssh), "via": via})


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
    path = RunFolder.of(record.run_id).record
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_text(json.dumps(dataclasses.asdict(record)), encoding="utf-8")
    tmp.replace(path)


class UnreadableRecord(UsageError):
    """This machine's record of a run exists but cannot be read (a truncated file, a newer
    tfdeploy's keys, JSON that is no record): named with its file, never taken for "no run"."""

    def __init__(self, run_id: str, path: Path, problem: str) -> None:
        super().__init__(
            f"the record of run {run_id} ({path}) cannot be read: {problem}",
            hint="name the run's inventory with -i INVENTORY: the run is found on its hosts "
            "(removing that file forgets only this machine's record)",
        )
        self.run_id = run_id
        self.path = path


def load(run_id: str) -> RunRecord | None:
    """The record of `run_id`, None when this machine has none; raises UnreadableRecord."""
    if not RUN_ID.match(run_id):
        raise UsageError(f"{run_id!r} is not a run id or an inventory file")
    path = RunFolder.of(run_id).record
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableRecord(run_id, path, getattr(exc, "strerror", None) or str(exc)) from None
    return _parse(run_id, path, text)


def load_if_readable(run_id: str) -> RunRecord | None:
    """The record, or None when there is none or it cannot be read: for callers that were told
    where the run is (-i INVENTORY), whom a record only adds hosts to."""
    try:
        return load(run_id)
    except UnreadableRecord:
        return None


def _parse(run_id: str, path: Path, text: str) -> RunRecord:
    try:
        data = boundedjson.loads(text)
    except ValueError as exc:
        raise UnreadableRecord(run_id, path, f"not valid JSON (a truncated file?): {exc}") from None
    problem = _shape_problem(data)
    if problem is None:
        try:
            return RunRecord.from_json(data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            problem = f"not a run record this tfdeploy knows ({exc})"
    raise UnreadableRecord(run_id, path, problem)


def _shape_problem(data: object) -> str | None:
    """What makes `data` no record this version can read, in words; None when it may be one."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {_json_kind(data)}"
    known = {f.name for f in dataclasses.fields(RunRecord)}
    missing = sorted(known - set(data) - {"hosts"})  # an older record has no hosts
    if missing:
        return f"missing {', '.join(map(repr, missing))}"
    unknown = sorted(set(data) - known)
    if unknown:
        return f"unknown key {', '.join(map(repr, unknown))} (written by a newer tfdeploy?)"
    hosts = data.get("hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        return "expected `hosts` to be a list of objects"
    host_keys = {f.name for f in dataclasses.fields(RunHost)}
    extra = sorted({k for h in hosts for k in h} - host_keys)
    if extra:
        return f"unknown host key {', '.join(map(repr, extra))} (written by a newer tfdeploy?)"
    return None


def _json_kind(data: object) -> str:
    if data is None:
        return "null"
    return {list: "an array", str: "a string", bool: "a boolean"}.get(type(data), "a number")


def mark_artifacts_pulled(run_id: str, where: str) -> None:
    """The marker `down` leaves once a detached run's job.artifacts are home: `status` stops
    saying they are waiting. A convenience of this machine's state, like the record."""
    runs_root().mkdir(parents=True, exist_ok=True, mode=0o700)
    RunFolder.of(run_id).artifacts_marker.write_text(where + "\n", encoding="utf-8")


def artifacts_pulled(run_id: str) -> bool:
    return RUN_ID.match(run_id) is not None and RunFolder.of(run_id).artifacts_marker.exists()
