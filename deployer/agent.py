"""Control-side client of the remote agent: installs it on a host and speaks docs/PROTOCOL.md.

Every call is one command on the host's existing connection with the request on stdin, so secrets
never appear on a command line and a call costs one round trip.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from deployer.errors import HostError
from deployer.transport import Transport

PROTOCOL_VERSION = 1
REMOTE_DIR = Path(__file__).resolve().parent.parent / "remote"

# Runs on the host with only the interpreter: makes sure this agent version is installed (files
# arrive on stdin), then hands the request to it. One round trip per host at preflight.
_BOOTSTRAP = """
import json, os, subprocess, sys
d = json.load(sys.stdin)
home = os.path.join(os.path.expanduser(d["workdir"]), "agent", d["agent_id"])
if not os.path.isfile(os.path.join(home, ".complete")):
    os.makedirs(home, 0o700, exist_ok=True)
    for name, text in d["files"].items():
        tmp = os.path.join(home, name + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(home, name))
    open(os.path.join(home, ".complete"), "w").close()
r = subprocess.run([sys.executable, os.path.join(home, "agent.py")],
                   input=json.dumps(d["request"]).encode(), capture_output=True)
sys.stdout.write(r.stdout.decode()); sys.stderr.write(r.stderr.decode()); sys.exit(r.returncode)
"""


@dataclass(frozen=True)
class TaskStatus:
    """One task as the host's agent reports it."""

    name: str
    state: str  # starting | running | exited | lost
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    started: float | None = None
    ended: float | None = None
    log_bytes: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskStatus:
        return cls(
            name=d["name"],
            state=d["state"],
            pid=d.get("pid"),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            reason=d.get("reason"),
            started=d.get("started"),
            ended=d.get("ended"),
            log_bytes=d.get("log_bytes") or 0,
        )

    @property
    def finished(self) -> bool:
        return self.state in ("exited", "lost")

    @property
    def succeeded(self) -> bool:
        return self.state == "exited" and self.exit_code == 0

    def outcome(self) -> str:
        """'exit 1', 'signal 9', 'lost': how a finished task ended, for reports."""
        if self.state == "lost":
            return "lost (its supervisor vanished: host crash or kill -9)"
        if self.reason in ("stopped", "lease expired"):
            return f"{self.reason} by tfdeploy" if self.reason == "stopped" else self.reason
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exit code {self.exit_code}"


@dataclass(frozen=True)
class Poll:
    tasks: tuple[TaskStatus, ...]
    logs: dict[str, tuple[int, bytes]]  # task name -> (new offset, bytes read)
    listening: frozenset[int]


@cache
def agent_files() -> dict[str, str]:
    """The remote side's source files, pushed to every host (the package marker is not needed)."""
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(REMOTE_DIR.glob("*.py"))
        if p.name != "__init__.py"
    }


@cache
def agent_id() -> str:
    """Content hash of the agent: two tfdeploy versions never overwrite each other's agent."""
    digest = hashlib.sha256()
    for name, text in agent_files().items():
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:12]


class Agent:
    """The agent on one host, reached through that host's transport."""

    def __init__(self, transport: Transport, *, python: str, workdir: str) -> None:
        self.transport = transport
        self.python = python
        self.workdir = workdir
        self.home: str | None = None  # absolute workdir, known after install()

    @property
    def host(self) -> str:
        return self.transport.name

    @property
    def agent_dir(self) -> str:
        if self.home is None:
            raise RuntimeError("Agent.install() must run before the agent directory is known")
        return f"{self.home}/agent/{agent_id()}"

    def install(self, ports: Sequence[int] = ()) -> dict[str, Any]:
        """Installs this agent version if the host lacks it and returns the `hello` facts."""
        request = {"v": PROTOCOL_VERSION, "op": "hello", "workdir": self.workdir, "ports": ports}
        payload = {
            "workdir": self.workdir,
            "agent_id": agent_id(),
            "files": agent_files(),
            "request": request,
        }
        reply = self._exchange([self.python, "-c", _BOOTSTRAP], payload, timeout=60)
        self.home = reply["workdir"]
        return reply

    def call(self, op: str, timeout: float | None = 60, **params: Any) -> dict[str, Any]:
        request = {"v": PROTOCOL_VERSION, "op": op, "workdir": self.workdir, **params}
        return self._exchange([self.python, f"{self.agent_dir}/agent.py"], request, timeout)

    def _exchange(
        self, argv: list[str], request: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        result = self.transport.run(argv, stdin=json.dumps(request).encode(), timeout=timeout)
        if result.exit_code == 127:
            raise HostError(
                self.host,
                f"{self.python!r} was not found on the host",
                hint="set job.python (or python on the host) to an installed interpreter",
            )
        try:
            reply: dict[str, Any] = json.loads(result.stdout)
        except ValueError:
            detail = (result.stderr or result.stdout).decode(errors="replace").strip()
            last = detail.splitlines()[-1] if detail else f"exit code {result.exit_code}"
            raise HostError(self.host, f"the tfdeploy agent failed: {last}") from None
        if not reply.get("ok"):
            raise HostError(self.host, str(reply.get("error", "the agent refused the request")))
        return reply

    # The operations of docs/PROTOCOL.md, typed for the rest of the control side.

    def missing(self, hashes: Sequence[str]) -> list[str]:
        return list(self.call("have", hashes=list(hashes))["missing"])

    def start(self, run_id: str, tasks: list[dict[str, Any]], grace: float) -> list[TaskStatus]:
        reply = self.call("start", run_id=run_id, tasks=tasks, grace=grace)
        return [TaskStatus.from_json(t) for t in reply["tasks"]]

    def poll(
        self,
        run_id: str,
        offsets: dict[str, int],
        *,
        max_bytes: int = 1 << 20,
        ports: Sequence[int] = (),
        heartbeat: bool = True,
    ) -> Poll:
        reply = self.call(
            "poll",
            timeout=30,
            run_id=run_id,
            offsets=offsets,
            max_bytes=max_bytes,
            ports=list(ports),
            heartbeat=heartbeat,
        )
        logs = {
            name: (int(entry["offset"]), base64.b64decode(entry["data"]))
            for name, entry in reply.get("logs", {}).items()
        }
        return Poll(
            tasks=tuple(TaskStatus.from_json(t) for t in reply["tasks"]),
            logs=logs,
            listening=frozenset(reply.get("listening", [])),
        )

    def stop(self, run_id: str, *, grace: float, tasks: Sequence[str] | None = None) -> None:
        self.call(
            "stop",
            timeout=grace + 60,
            run_id=run_id,
            grace=grace,
            tasks=list(tasks) if tasks is not None else None,
        )

    def runs(self) -> list[dict[str, Any]]:
        return list(self.call("runs")["runs"])
