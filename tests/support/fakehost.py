"""A scripted host behind the Transport interface, for testing the control side in-process.

It answers the agent protocol (docs/PROTOCOL.md) the way remote/agent.py would, from state a test
sets and changes between ticks: tasks write lines and exit when told, a host can refuse
connections or stop answering. Its replies are the shapes of remote/protocol.py (mypy holds it to
them, tests/unit/test_wire_contract.py compares them with a real agent's). Like fabric's
MockRemote, it replaces only the wire: the Agent client, Fleet, Poller, board and Deployment
above it are the real ones. What only real hosts can prove (sshd, processes, signals,
TensorFlow) stays in the lab tests.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer.config.model import Host
from deployer.core.errors import HostError
from deployer.hosts.transport import CommandResult, OutputTooLarge
from remote import protocol


class FakeClock:
    """A monotonic clock that moves only when the code under test sleeps (or a test advances it)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[float], None] | None = None  # e.g. a Ctrl-C at some time

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.now)


@dataclass
class FakeTask:
    name: str
    command: str
    env: dict[str, str]
    started: float
    pid: int
    log: bytearray = field(default_factory=bytearray)
    state: str = protocol.STATE_RUNNING
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    ended: float | None = None
    restarts: int = 0
    listening: bool = False

    def status(self) -> protocol.TaskStatusShape:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "pgid": self.pid,
            "started": self.started,
            "ended": self.ended,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "notice": None,
            "disk_full": None,
            "log_bytes": len(self.log),
            "restarts": self.restarts,
            "frozen": False,
        }


class FakeHost:
    """One host's scripted agent: the requests it got, and the tasks it runs."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        self.name = name
        self.clock = clock
        self.facts: protocol.HelloReply = {
            "hostname": name,
            "python": "3.11.2",
            "executable": "/usr/bin/python3.11",
            "prefix": "/usr",
            "machine": "x86_64",
            "glibc": "2.36",
            "tensorflow": "2.21.0",
            "frameworks": {"keras": "3.15.1"},  # what tensorflow-cpu 2.21 pulls in
            "workdir": f"/fake/{name}/.tfdeploy",
            "disk_free": 10**12,
            "store_empty": True,  # set at each hello from the store
            "busy_ports": [],
            "reserved_by": {},
            "agent_id": "fake",
            "host_id": f"{name}-0123456789ab",
            "shared_with": [],  # host ids whose tokens this host's workdir holds
        }
        self.requests: list[dict[str, Any]] = []
        self.venvs: set[str] = set()
        self.reserved: dict[int, str] = {}  # TF port -> run id holding it (remote/reservations)
        self.detached: set[str] = set()  # runs whose lease `detach` dropped
        self.tasks: dict[str, FakeTask] = {}
        self.store: set[str] = set()  # content hashes; hosts sharing a workdir share the set
        self.received_bytes = 0
        self.listen_on_start = True  # servers (ps) accept connections as soon as they start
        self.on_start: Callable[[FakeTask], None] | None = None
        self.refusing: str | None = None  # set: every call fails with this cause
        # Network check: what a probe from this host to (address, port) gets; absent: "ok".
        self.verdicts: dict[tuple[str, int], str] = {}
        self.stand_ins: set[int] = set()  # ports the network check listens on right now
        self.stopped_runs: set[str] = set()  # runs stopped whole: nothing of them starts again
        # Files tasks left in their directories: {task: {relative path: content}} (pull), and
        # their modes by path (absent: 0o644).
        self.files: dict[str, dict[str, bytes]] = {}
        self.modes: dict[str, int] = {}
        # How fetch's raw bytes reach the controller: (bytes, the controller's sink, an event set
        # when the controller closes the session). Absent: all at once. A test delivers part,
        # stalls, interrupts...
        self.deliver: Callable[[bytes, Callable[[bytes], None], threading.Event], None] | None
        self.deliver = None
        self.silent = threading.Event()  # set: calls hang until cleared (a cut link)
        self._next_pid = 100
        self._lock = threading.Lock()

    # ---- what tests do to the host ---------------------------------------------------------

    def write(self, task: str, text: str) -> None:
        self.tasks[task].log += text.encode()

    def exit(self, task: str, code: int = 0, *, signal: int | None = None) -> None:
        t = self.tasks[task]
        t.state, t.exit_code, t.signal, t.ended = protocol.STATE_EXITED, code, signal, self.clock()
        t.reason = protocol.REASON_SIGNAL if signal is not None else protocol.REASON_EXITED

    def ops(self, op: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("op") == op]

    # ---- the agent protocol --------------------------------------------------------------

    def answer(self, data: bytes, timeout: float | None) -> bytes:
        """The reply line to one request (its first line; materialize's contents follow it)."""
        if self.silent.is_set():
            self.silent.wait(timeout)  # hold the call as a dead link would, then time out
            raise HostError(self.name, f"the agent did not answer within {timeout} s")
        if self.refusing:
            raise HostError(self.name, self.refusing)
        line, _, stream = data.partition(b"\n")
        request = json.loads(line)
        if "request" in request:  # the bootstrap's first line wraps the hello
            request = request["request"]
        with self._lock:
            self.requests.append(request)
            self.received_bytes += len(stream)
            handler = getattr(self, f"_op_{request['op']}")
            reply = {"v": protocol.PROTOCOL_VERSION, "ok": True, **handler(request)}
        raw: bytes = reply.pop("_raw", b"")  # sent after the reply line, as the agent's fetch does
        return json.dumps(reply).encode() + b"\n" + raw

    def _op_hello(self, req: dict[str, Any]) -> protocol.HelloReply:
        facts = self.facts.copy()
        facts["store_empty"] = not self.store  # as remote/agent.py answers
        if req.get("runs"):
            facts["runs"] = self._op_runs(req)["runs"]
            facts["nvidia_smi"] = False  # as _op_gpus says
        run_id, ports = req.get("run_id"), req.get("ports", [])
        if run_id is None:
            return facts
        held = {p: self.reserved[p] for p in ports if self.reserved.get(p, run_id) != run_id}
        busy = sorted(set(facts["busy_ports"]) | set(held))
        if not busy:  # all or nothing, as on a real host
            self.reserved.update(dict.fromkeys(ports, run_id))
        if not busy and req.get("listen"):  # the network check's stand-ins, as remote/ starts
            self.stand_ins = set(req["listen"]["ports"])
            facts["listening"] = 1
        facts["busy_ports"], facts["reserved_by"] = busy, {str(p): r for p, r in held.items()}
        facts["reserved_state"] = {str(p): "starting" for p in held}  # as remote/agent.py says
        return facts

    def _op_release(self, req: dict[str, Any]) -> protocol.ReleaseReply:
        released = [p for p, r in self.reserved.items() if r == req["run_id"]]
        self._drop_reservations(req["run_id"])
        self.stand_ins = set()  # release stops them too
        return {"released": len(released)}

    def _op_detach(self, req: dict[str, Any]) -> protocol.DetachReply:
        self.detached.add(req["run_id"])
        return {"detached": True}

    def _drop_reservations(self, run_id: str) -> None:
        self.reserved = {p: r for p, r in self.reserved.items() if r != run_id}

    def _op_gpus(self, req: dict[str, Any]) -> protocol.GpusReply:
        return {"nvidia_smi": None, "error": None, "gpus": [], "apps": [], "lost": []}

    def _op_have(self, req: dict[str, Any]) -> protocol.HaveReply:
        return {"missing": [h for h in req["hashes"] if h not in self.store]}

    def _op_materialize(self, req: dict[str, Any]) -> dict[str, Any]:
        self.stand_ins = set()  # the run's code arriving ends its network check (remote/store.py)
        blobs = req.get("blobs", [])
        self.store.update(blob[0] for blob in blobs)
        wanted = {f[1] for f in req.get("files", [])} | set(req.get("keep", []))
        lacking = sorted(wanted - self.store)
        if lacking and req.get("or_missing") and not blobs:  # as remote/store.py answers
            return {"missing": lacking}
        if lacking:
            return _failure(f"the store lacks the content of {len(lacking)} file(s)")
        placed: protocol.MaterializeReply = {"files": len(req.get("files", []))}
        return dict(placed)

    def _op_env(self, req: dict[str, Any]) -> protocol.EnvReply:
        """As remote/envop.py answers: a venv per hash, built once; its wheels in the store."""
        lacking = [w[0] for w in req.get("wheels", []) if w[1] not in self.store]
        if lacking:
            return _failure(f"the store lacks the wheel {lacking[0]}")  # type: ignore[return-value]
        venv = f"{self.facts['workdir']}/envs/{req['hash']}"
        built = venv not in self.venvs
        self.venvs.add(venv)
        checked = [f"/usr/bin/python{self.facts['python'][:4]}", venv]
        return {
            "venv": venv,
            "built": built,
            "waited": False,
            "installer": "pip" if built else None,
            "seconds": 1.0 if built else 0.0,
            "python": self.facts["python"],
            "tensorflow": self.facts["tensorflow"],
            "interpreters": {
                "checked": checked,
                "found": {w: checked for w in req.get("words", [])},
            },
        }

    def _op_image(self, req: dict[str, Any]) -> protocol.ImageReply:
        """As remote/imageop.py answers: podman as root on linux/amd64; the image present once
        pulled (check with `pull`) or loaded (`load`)."""
        images = self.__dict__.setdefault("images", set())
        if req.get("pull") or req["action"] == protocol.IMAGE_LOAD:
            images.add(req["image"])
        present = req["image"] in images
        reply: protocol.ImageReply = {
            "runtime": "podman",
            "rootless": False,
            "platform": "linux/amd64",
            "present": present,
            "pulled": bool(req.get("pull")) and req["action"] == protocol.IMAGE_CHECK,
            "image_platform": "linux/amd64" if present else None,
        }
        if present:  # the trial container ran; the fake image holds no Python
            reply["tried"] = True
            reply["tensorflow"] = None
        return reply

    def _op_setup(self, req: dict[str, Any]) -> protocol.SetupReply:
        return {"ran": True, "code": 0, "tail": []}

    def _op_start(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["run_id"] in self.stopped_runs:  # as remote/taskops.py answers
            return _failure(
                f"run {req['run_id']} was stopped; nothing of it starts again",
                protocol.FAIL_RUN_STOPPED,
            )
        started = []
        for spec in req["tasks"]:
            old = self.tasks.get(spec["name"])
            self._next_pid += 1
            task = FakeTask(
                spec["name"], spec["command"], spec["env"], self.clock(), self._next_pid
            )
            if old is not None:
                task.log, task.restarts = old.log, old.restarts + 1
            task.listening = self.listen_on_start
            self.tasks[task.name] = task
            if self.on_start is not None:
                self.on_start(task)
            started.append(task.status())
        if req.get("release"):
            self._drop_reservations(req["run_id"])
        reply: protocol.TasksReply = {"tasks": started}
        return dict(reply)

    def _op_poll(self, req: dict[str, Any]) -> dict[str, Any]:
        budget = int(req.get("max_bytes", 1 << 20))
        logs: list[protocol.LogShape] = []
        raw = b""
        for name, offset in req.get("offsets", {}).items():
            data = bytes(self.tasks[name].log[offset : offset + budget])
            budget -= len(data)
            logs.append({"task": name, "offset": offset + len(data), "bytes": len(data)})
            raw += data  # after the reply line, as the agent's poll sends them
        ports = set(req.get("ports", []))
        listening = [p for p in ports if self._listening(p)]
        reply: protocol.PollReply = {
            "tasks": [t.status() for t in self.tasks.values()],
            "logs": logs,
            "listening": listening,
        }
        if raw:
            reply["raw"] = len(raw)
        return {**reply, **({"_raw": raw} if raw else {})}

    def _listening(self, port: int) -> bool:
        return any(
            t.listening and t.state == protocol.STATE_RUNNING and _port(t) == port
            for t in self.tasks.values()
        )

    def _op_stop(self, req: dict[str, Any]) -> protocol.StopReply:
        names = req.get("tasks")
        if names is None:  # a whole-run stop ends the run's reservations too, and the run
            self._drop_reservations(req.get("run_id", ""))
            self.stand_ins = set()
            self.stopped_runs.add(req.get("run_id", ""))
        named = [t for t in self.tasks.values() if names is None or t.name in names]
        for task in named:
            if task.state == protocol.STATE_RUNNING:
                task.state, task.ended = protocol.STATE_EXITED, self.clock()
                task.reason, task.signal = protocol.REASON_STOPPED, 15
        reply: protocol.StopReply = {"tasks": [t.status() for t in named]}
        if names is None or req.get("escaped"):  # the run's scan for escaped processes ran
            reply["escaped"] = []
        return reply

    def _op_runs(self, req: dict[str, Any]) -> protocol.RunsReply:
        return {"runs": []}

    def _op_prune(self, req: dict[str, Any]) -> protocol.PruneReply:
        """Holds no run directories: nothing to remove, the store's contents stay (as a host's
        do while no run is gone)."""
        return {
            "runs": [],
            "running": [],
            "contents": 0,
            "environments": [],
            "checkpoints": [],
            "bytes": 0,
            "dry_run": bool(req.get("dry_run", False)),
        }

    def _op_idle(self, req: dict[str, Any]) -> protocol.IdleReply:
        """As remote/idle.py answers: 0 minutes disarms; else armed, with a watchdog's pid."""
        minutes = float(req["minutes"])
        if minutes == 0:
            return {"armed": False, "pid": None, "minutes": 0.0}
        return {"armed": True, "pid": 4242, "minutes": minutes}

    def _op_peers(self, req: dict[str, Any]) -> dict[str, Any]:
        """As remote/peers.py answers a close (nothing relays through a fake host)."""
        if req["action"] != protocol.PEERS_CLOSE:
            return _failure("the fake host relays no stream: its tests push without peers")
        closed: protocol.ClosedReply = {"closed": False}
        return dict(closed)

    def _op_firewall(self, req: dict[str, Any]) -> protocol.FirewallReply:
        if req["action"] == protocol.FIREWALL_CHECK:
            return {"backend": "nft", "problem": None}
        if req["action"] == protocol.FIREWALL_REMOVE:
            return {"removed": 0}
        return {"backend": "nft", "rules": []}

    def _op_collect(self, req: dict[str, Any]) -> protocol.CollectReply:
        found: dict[str, protocol.CollectedShape] = {}
        for task, files in self.files.items():
            if req.get("tasks") is not None and task not in req["tasks"]:
                continue
            hashed = req.get("hash", True)  # remote/results.py: null when not asked
            only = req.get("hash_only")  # ... or not among the paths named for the task
            listed = [
                [
                    path,
                    len(data),
                    self.modes.get(path, 0o644),
                    hashlib.sha256(data).hexdigest()
                    if hashed and (only is None or path in only.get(task, []))
                    else None,
                ]
                for path, data in sorted(files.items())
                if any(fnmatch.fnmatch(path, p) for p in req["patterns"])
            ]
            found[task] = {"files": listed, "refused": [], "unread": 0}
        return {"tasks": found}

    def _op_fetch(self, req: dict[str, Any]) -> dict[str, Any]:
        data = self.files[req["task"]].get(req["path"])
        if data is None:  # gone since it was listed: the agent's words for it
            return _failure(f"{req['path']}: not a file of task {req['task']}")
        chunk = data[req["offset"] :]
        if req.get("hash"):  # the whole file's sha256 and "stood still" follow the bytes
            chunk += hashlib.sha256(data).hexdigest().encode() + b"1"
        return {"size": len(data), "raw": len(chunk), "_raw": chunk}

    def _op_netcheck(self, req: dict[str, Any]) -> protocol.NetcheckReply:
        if req["action"] == protocol.NETCHECK_LISTEN:
            self.stand_ins = set(req["ports"])
            return {"pid": 1}
        if req["action"] == protocol.NETCHECK_CLOSE:
            self.stand_ins = set()
            return {"closed": True}
        verdicts = [self.verdicts.get((a, p), protocol.PROBE_OK) for a, p in req["targets"]]
        return {"results": verdicts}


def _port(task: FakeTask) -> int | None:
    """The port TF_CONFIG gives the task itself (what its server would bind)."""
    config = json.loads(task.env.get("TF_CONFIG", "{}"))
    own = config.get("task", {})
    endpoints = config.get("cluster", {}).get(own.get("type"), [])
    index = own.get("index", 0)
    return int(endpoints[index].rsplit(":", 1)[1]) if index < len(endpoints) else None


class FakeSession:
    """The agent's `serve` loop on a fake host: one reply line per request."""

    def __init__(self, host: FakeHost) -> None:
        self.name = host.name
        self.host = host
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self._raw = b""
        self._answers: list[bytes] = []  # answers to requests sent ahead (send), in order

    def request(self, data: bytes, timeout: float | None, body: Iterable[bytes] = ()) -> bytes:
        line, _, self._raw = self.host.answer(data + b"".join(body), timeout).partition(b"\n")
        return line + b"\n"

    def send(self, data: bytes) -> None:
        self._answers.append(self.host.answer(data, None))

    def reply(self, timeout: float | None) -> bytes:
        line, _, self._raw = self._answers.pop(0).partition(b"\n")
        return line + b"\n"

    def read_raw(self, size: int, sink: Callable[[bytes], None], timeout: float | None) -> None:
        data, self._raw = self._raw[:size], self._raw[size:]
        if self.host.deliver is None:
            sink(data)
        else:
            self.host.deliver(data, sink, self.closed)
        if self.closed.is_set():  # as a real session reports a channel closed under a read
            raise HostError(self.name, "the session was closed")

    def close(self) -> None:
        self.closed.set()


class FakeTransport:
    """Transport to a FakeHost: agent calls reach its scripted answers, nothing else runs."""

    def __init__(self, host: FakeHost) -> None:
        self.name = host.name
        self.host = host

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        out = self.host.answer(stdin, timeout)
        if max_output is not None and len(out) > max_output:
            raise OutputTooLarge(self.name, argv, max_output)
        return CommandResult(0, out, b"")

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        raise NotImplementedError("the control side pushes through the agent, not put()")

    def open_session(self, argv: Sequence[str]) -> FakeSession:
        if self.host.refusing:
            raise HostError(self.name, self.host.refusing)
        return FakeSession(self.host)

    def connect(self) -> None:
        if self.host.refusing:
            raise HostError(self.name, self.host.refusing)

    def close(self) -> None:
        pass


class FakeFleetHosts:
    """Fake hosts by name, and the `connect` function a Fleet takes to reach them."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.hosts: dict[str, FakeHost] = {}

    def __getitem__(self, name: str) -> FakeHost:
        if name not in self.hosts:
            self.hosts[name] = FakeHost(name, self.clock)
        return self.hosts[name]

    def connect(self, host: Host) -> FakeTransport:
        return FakeTransport(self[host.name])


class RecordingView:
    """A View that keeps what it was shown (a real renderer's input, not a mock of one)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.phases: list[str] = []
        self.output: list[str] = []
        self.rows: list[list[Any]] = []
        self.closed = False

    def step(self, text: str) -> None:
        self.steps.append(text)

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def lines(self, label: str, lines: Sequence[str]) -> None:
        self.output += [f"{label} | {line}" for line in lines]

    def tasks(self, rows: Sequence[Any]) -> None:
        self.rows.append(list(rows))

    def close(self) -> None:
        self.closed = True


def _failure(error: str, code: str = protocol.FAIL_REFUSED) -> dict[str, Any]:
    """A failure reply's fields (ok: false), as remote/agent.py's `_error` builds them."""
    failure: protocol.FailureReply = {"error": error, "code": code}
    return {"ok": False, **failure}
