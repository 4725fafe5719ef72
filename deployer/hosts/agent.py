"""Control-side client of the remote agent: installs it on a host and speaks docs/PROTOCOL.md.

Every call is one command on the host's existing connection with the request on stdin, so secrets
never appear on a command line and a call costs one round trip.
"""

from __future__ import annotations

import collections
import contextlib
import json
import signal
import threading
import zlib
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from deployer.core.errors import HostError
from deployer.hosts.replies import Edge, mode, text
from deployer.hosts.transport import Session, SessionEnded, Transport
from remote import protocol

Shape = TypeVar("Shape")


class _SessionLeft(Exception):
    """The host's session ended while idle; the request was never read, so resending is safe."""


REMOTE_DIR = Path(__file__).resolve().parents[2] / "remote"

# Runs on the host with only the interpreter: makes sure this agent version is installed (when it
# is not, the bootstrap answers `needs_files` and the files arrive as the next stdin line: 160 KB
# that a host which has them never gets again), answers the hello request in the same process,
# then keeps serving requests on the same channel (`agent.serve`) until stdin closes: every later
# call of the connection costs one round trip instead of an sshd session and a Python start
# (~50 ms of host CPU). Fed all at once with EOF, it answers the hello alone and exits
# (one-shot mode).
# Hosts sharing a home (NFS) may install at once: each writes its own temporary names, and a
# rename puts identical content in place.
# The version gate comes first and uses nothing newer than Python 2 syntax, so an interpreter
# too old for the agent says so instead of failing on some later line. The look-only reply
# speaks protocol.PROTOCOL_VERSION, as the agent does.
MIN_HOST_PYTHON = (3, 8)
TOO_OLD_EXIT = 79  # the bootstrap's exit status when the host's Python is older than that
_VERSION_GATE = f"""
import sys
if sys.version_info < {MIN_HOST_PYTHON!r}:
    sys.stderr.write(".".join(str(n) for n in sys.version_info[:3]))
    sys.exit({TOO_OLD_EXIT})
"""
_BOOTSTRAP = (
    _VERSION_GATE
    + f"V = {protocol.PROTOCOL_VERSION!r}\n"
    + f"NEEDS = {protocol.BOOTSTRAP_NEEDS_FILES!r}\n"
    + """
import hashlib, json, os, shutil, zlib
if not os.environ.get("HOME", "x"):
    del os.environ["HOME"]  # empty: ~ must come from the passwd entry, not become "/"
d = json.loads(sys.stdin.buffer.readline())
w = os.path.expanduser(d["workdir"])
if d.get("look_only") and not os.path.isdir(w):
    sys.stdout.write(json.dumps({"v": V, "ok": True, "absent": True, "workdir": w}) + "\\n")
    sys.exit(0)
home = os.path.join(w, "agent", d["agent_id"])
def intact():
    # The directory is named by its files' content hash (protocol.agent_id): a corrupted or
    # half-written file is installed again, never run. Integrity, not trust: the host owns it.
    try:
        names = sorted(n for n in os.listdir(home) if n.endswith(".py") and n != "__init__.py")
        h = hashlib.sha256()
        for n in names:
            with open(os.path.join(home, n), "rb") as f:
                h.update(n.encode() + b"\\0" + f.read() + b"\\0")
    except OSError:
        return False
    return os.path.isfile(os.path.join(home, ".complete")) and h.hexdigest()[:12] == d["agent_id"]
def install():
    files = d.get("files")
    if files is None:
        sys.stdout.write(json.dumps({"v": V, "ok": True, NEEDS: True, "workdir": w}) + "\\n")
        sys.stdout.flush()
        size = int(sys.stdin.buffer.readline())
        files = json.loads(zlib.decompress(sys.stdin.buffer.read(size)))
    os.makedirs(home, 0o700, exist_ok=True)
    for name in os.listdir(home):  # a stray module would change the hash at every hello
        if name.endswith(".py") and name not in files:
            try:
                os.unlink(os.path.join(home, name))
            except OSError:
                pass  # gone already: another host of a shared home cleaned it
    # What was compiled from a damaged file may pass Python's mtime-and-size check.
    shutil.rmtree(os.path.join(home, "__pycache__"), ignore_errors=True)
    for name, text in files.items():
        tmp = os.path.join(home, "%s.part-%s-%d" % (name, os.uname()[1], os.getpid()))
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(home, name))
    open(os.path.join(home, ".complete"), "w").close()
if not intact():
    install()
sys.path.insert(0, home)
import agent
sys.exit(agent.serve(json.dumps(d["request"]).encode()))
"""
)


@dataclass(frozen=True)
class TaskStatus:
    """One task as the host's agent reports it."""

    name: str
    state: str  # one of protocol.TASK_STATES
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # one of protocol.EXIT_REASONS, once exited
    started: float | None = None
    ended: float | None = None
    log_bytes: int = 0
    restarts: int = 0  # how often the task was started again after it ended
    frozen: bool = False  # running, but stopped by a signal (SIGSTOP): it will never progress
    disk_full: str | None = None  # the host's file system that was full when it ended

    @classmethod
    def from_json(cls, raw: object, edge: Edge, known: Collection[str] | None = None) -> TaskStatus:
        """One task of a host's reply, checked (deployer/hosts/replies.py): its name becomes
        file names here and its texts are printed. `known`: the task names the run asked for."""
        d = edge.obj(raw, "a task")
        name = edge.task(edge.get(d, "name", "a task's name"), "a task's name", known)
        reason = d.get("reason")
        return cls(
            name=name,
            state=edge.choice(
                edge.get(d, "state", f"{name}'s state"), "state", protocol.TASK_STATES
            ),
            pid=edge.integer(d.get("pid"), f"{name}'s pid", optional=True),
            exit_code=edge.integer(d.get("exit_code"), f"{name}'s exit_code", optional=True),
            signal=edge.integer(d.get("signal"), f"{name}'s signal", optional=True),
            reason=None if reason is None else text(reason),
            started=edge.number(d.get("started"), f"{name}'s started"),
            ended=edge.number(d.get("ended"), f"{name}'s ended"),
            log_bytes=edge.count(d.get("log_bytes") or 0, f"{name}'s log_bytes"),
            restarts=edge.count(d.get("restarts") or 0, f"{name}'s restarts"),
            frozen=bool(d.get("frozen")),
            disk_full=d["disk_full"] if isinstance(d.get("disk_full"), str) else None,
        )

    @property
    def finished(self) -> bool:
        return self.state in (protocol.STATE_EXITED, protocol.STATE_LOST)

    @property
    def succeeded(self) -> bool:
        """Exited 0 by itself: a task that saved a checkpoint on a spot notice and exited 0 has
        not finished its work."""
        return self.state == protocol.STATE_EXITED and self.exit_code == 0 and not self.preempted

    @property
    def preempted(self) -> bool:
        """Stopped because its machine is being taken away (a spot interruption notice)."""
        return self.reason == protocol.REASON_PREEMPTED

    def outcome(self) -> str:
        """'exit 1', 'signal 9', 'lost': how a finished task ended, for reports; and that the
        host's disk was full when it ended (the likely cause of a failure then)."""
        if self.disk_full is None:
            return self._ended()
        return f"{self._ended()}; the host's disk was full ({self.disk_full})"

    def _ended(self) -> str:
        if self.state == protocol.STATE_LOST:
            return "lost (its supervisor vanished: host crash or kill -9)"
        if self.reason == protocol.REASON_PREEMPTED:
            return "preempted: its spot instance got an interruption notice"
        if self.reason == protocol.REASON_STOPPED:
            return f"{self.reason} by tfdeploy"
        if self.reason == protocol.REASON_LEASE_EXPIRED:
            return self.reason
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.exit_code is not None and 128 < self.exit_code <= 128 + 64:
            # A shell running the command reports a child killed by signal N as 128+N.
            return f"exit code {self.exit_code}: a process killed by signal {self.exit_code - 128}?"
        return f"exit code {self.exit_code}"


@dataclass(frozen=True)
class Poll:
    tasks: tuple[TaskStatus, ...]
    logs: dict[str, tuple[int, bytes]]  # task name -> (new offset, bytes read)
    listening: frozenset[int]


@dataclass(frozen=True)
class SetupResult:
    """The setup op on one host: `ran` is False when the fingerprint's marker was there."""

    code: int  # 0 ok, else the failing command's status (128+N: killed by signal N)
    ran: bool
    tail: tuple[str, ...]  # the last lines this setup wrote


@dataclass(frozen=True)
class RemoteFile:
    """A file a task left on its host, as `collect` lists it."""

    path: str  # relative to the task's directory, or absolute (an absolute pattern's match)
    size: int
    mode: int  # permission bits only (0o777): a host never sets setuid here
    sha256: str | None  # None: listed unhashed, the fetch hashes (Agent.collect's `hashed`)


@dataclass(frozen=True)
class Collected:
    files: tuple[RemoteFile, ...]
    refused: tuple[str, ...]  # patterns or matches not pulled, and why

    @classmethod
    def from_json(cls, raw: object, edge: Edge, task: str) -> Collected:
        """A task's listing, checked: each path stays inside its task's folder (or is one
        absolute pattern's match), each mode keeps its permission bits, each refusal is text."""
        d = edge.obj(raw, task)
        files = []
        for entry in edge.items(edge.get(d, "files", f"{task}'s files"), f"{task}'s files"):
            if not isinstance(entry, list) or len(entry) != 4:
                raise edge.error(
                    f"{task}'s files", f"hold {entry!r:.60}, not [path, size, mode, sha]"
                )
            path = edge.path(entry[0], f"{task}'s file", absolute=True)
            field = f"{task}'s file {path!r}"
            files.append(
                RemoteFile(
                    path,
                    edge.count(entry[1], f"{field} size"),
                    mode(edge.count(entry[2], f"{field} mode")),
                    edge.sha256(entry[3], f"{field} sha256"),
                )
            )
        return cls(tuple(files), edge.texts(d.get("refused", []), f"{task}'s refused"))


@dataclass(frozen=True)
class Escaped:
    """A process of the run that had left its task's process group, stopped with the run."""

    pid: int
    cmd: str
    signal: int | None  # the last signal it got (None: it was gone before one was sent)


def escaped_text(escaped: Sequence[Escaped], mask: Callable[[str], str]) -> str:
    """The escaped processes a stop killed, for the user: pid, command (masked), last signal."""

    def one(e: Escaped) -> str:
        how = "gone before a signal" if e.signal is None else _signal_name(e.signal)
        return f"pid {e.pid} ({mask(e.cmd)}): {how}"

    what = "process" if len(escaped) == 1 else "processes"
    listed = "; ".join(one(e) for e in escaped)
    left = "of the run that had left its task's process group"
    return f"also stopped {len(escaped)} {what} {left}: {listed}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class StopReport:
    tasks: tuple[TaskStatus, ...]
    escaped: tuple[Escaped, ...] = ()


@cache
def agent_files() -> dict[str, str]:
    """The remote side's source files, pushed to every host (the package marker is not needed)."""
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(REMOTE_DIR.glob("*.py"))
        if protocol.is_pushed(p.name)
    }


@cache
def _agent_files_message() -> bytes:
    """The files as the bootstrap reads them, encoded once per process: the size of what
    follows on a line, then the JSON compressed (a third of its size: a first deploy over a
    laptop's uplink sends it to every host). Every Python that can pip-install has zlib."""
    packed = zlib.compress(json.dumps(agent_files()).encode(), 6)
    return b"%d\n" % len(packed) + packed


@cache
def agent_id() -> str:
    """Content hash of the agent: two tfdeploy versions never overwrite each other's agent."""
    return protocol.agent_id((name, text.encode()) for name, text in agent_files().items())


class Agent:
    """The agent on one host, reached through that host's transport."""

    def __init__(self, transport: Transport, *, python: str, workdir: str) -> None:
        self.transport = transport
        self.python = python
        self.workdir = workdir
        self.home: str | None = None  # absolute workdir, known after install()
        self.absent = False  # install(look_only=True) found no workdir: the host has no runs
        self._session: Session | None = None  # the bootstrap, still serving after install()
        self._in_flight = 0  # requests waiting for their reply, from any thread
        self._in_flight_lock = threading.Lock()
        self._abandoned = False  # a request was cut short by Ctrl-C: its bytes may still queue

    @property
    def busy(self) -> bool:
        """Whether a request to this host is waiting for its reply, or was abandoned half-way by
        Ctrl-C: Fleet.interrupt then drops the connection, so that the stop does not queue behind
        what is still in its send buffer (a push on a slow link: many seconds)."""
        return self._in_flight > 0 or self._abandoned

    @contextlib.contextmanager
    def _request(self) -> Iterator[None]:
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            yield
        except KeyboardInterrupt:  # Ctrl-C or a signal on this (the main) thread
            self._abandoned = True
            raise
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    @property
    def host(self) -> str:
        return self.transport.name

    @property
    def agent_dir(self) -> str:
        if self.home is None:
            raise RuntimeError("Agent.install() must run before the agent directory is known")
        return f"{self.home}/agent/{agent_id()}"

    def install(
        self,
        ports: Sequence[int] = (),
        *,
        run_id: str | None = None,
        lease_seconds: float | None = None,
        look_only: bool = False,
        runs: bool = False,
        hosts_of: str | None = None,
        listen: tuple[Sequence[int], float] | None = None,
    ) -> dict[str, Any]:
        """Installs this agent version if the host lacks it and returns the `hello` facts.

        `look_only` (status, logs, down): a host without the workdir holds no run, and a verb
        that only looks must create nothing there; the reply is then `{"absent": True}`.

        With a run id, the free `ports` are reserved for that run on the host until it stops or
        its lease lapses (`lease_seconds` without a heartbeat): two `up` of one inventory started
        at once cannot both pass preflight. Ports reserved by another run come back busy.
        """
        hello: protocol.HelloRequest = {"ports": list(ports)}
        if run_id is not None:
            hello["run_id"], hello["lease_seconds"] = run_id, lease_seconds
            if listen is not None:  # the network check's stand-ins, when no port is busy
                hello["listen"] = {"ports": list(listen[0]), "seconds": listen[1]}
        if runs:
            hello["runs"] = True
            if hosts_of:
                hello["hosts_of"] = hosts_of
        envelope: protocol.Envelope = {
            "v": protocol.PROTOCOL_VERSION,
            "op": protocol.OP_HELLO,
            "workdir": self.workdir,
        }
        request = {**envelope, **hello}
        payload = {
            "workdir": self.workdir,
            "look_only": look_only,
            "agent_id": agent_id(),
            "request": request,
        }
        # -S: the bootstrap and the session after it need no site-packages (the hello finds
        # TensorFlow's dist-info itself); `site` costs ~15 ms of host CPU per connection.
        argv = [self.python, "-S", "-c", _BOOTSTRAP]
        self.close_session()
        try:
            session = self.transport.open_session(argv)
        except SessionEnded as exc:
            self._reply(exc.exit_code, b"", exc.stderr)
            raise  # _reply always raises for an ended session
        self._session = session
        with session.lock, self._request():
            reply = self._over(session, json.dumps(payload).encode() + b"\n", 60)
            if reply.get(protocol.BOOTSTRAP_NEEDS_FILES):  # a host without this agent version
                reply = self._over(session, _agent_files_message(), 60)
        edge = Edge(self.host, protocol.OP_HELLO)
        if reply.get("absent") is True:  # look_only, and the host has no workdir
            edge.reply(reply, protocol.AbsentReply)
        else:
            edge.reply(reply, protocol.HelloReply)
            if runs:
                edge.get(reply, "runs")
        # The hello's facts (versions, host names, ids, problems) are printed by preflight and
        # status: cleaned here; the runs it may carry are parsed by their reader.
        reply = {k: v if k == "runs" else cleaned_texts(v) for k, v in reply.items()}
        self.home = reply["workdir"]
        self.absent = bool(reply.get("absent"))
        if self.absent:
            self.close_session()  # the bootstrap answered and left: nothing is installed
        return reply

    def call(
        self,
        op: str,
        timeout: float | None = 60,
        *,
        body: Iterable[bytes] = (),
        sink: Callable[[bytes], None] | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """One op. `body`: raw bytes sent after the request line, piece by piece (materialize's
        contents); `sink`: where the raw bytes after the reply line go (fetch's)."""
        line = self._request_line(op, params)
        session = self._session
        if session is not None and session.lock.acquire(blocking=False):
            try:
                with self._request():
                    return self._over(session, line, timeout, body, sink, op)
            except _SessionLeft:
                pass  # it left while idle, before reading this request: send it one-shot
            finally:
                session.lock.release()
        # Busy session (another thread's call) or none: a one-shot agent process. Bulk work
        # uses a session of its own (`dedicated`), so a body here is small.
        # -S: the agent is stdlib-only; skipping site-packages (a TF venv's .pth files) halves
        # the interpreter's start, which every one-shot call pays on the host.
        argv = [self.python, "-S", f"{self.agent_dir}/agent.py"]
        with self._request():
            result = self.transport.run(argv, stdin=line + b"".join(body), timeout=timeout)
        # The reply is the first line; raw bytes may follow it (a poll's logs, a fetch). What
        # is no reply at all (a crash) is reported from the whole output.
        first, _, rest = result.stdout.partition(b"\n")
        said = first if first.startswith(b"{") else result.stdout
        reply = self._reply(result.exit_code, said, result.stderr)
        raw = _raw_count(Edge(self.host, op), reply)
        if raw is not None:
            (sink or _discard)(rest[:raw])
        return reply

    def ask(
        self,
        op: str,
        shape: Callable[..., Shape],
        timeout: float | None = 60,
        *,
        body: Iterable[bytes] = (),
        sink: Callable[[bytes], None] | None = None,
        **params: Any,
    ) -> Shape:
        """One op whose reply is checked against its shape in remote/protocol.py at the edge
        (deployer/hosts/replies.py): what the rest of the control side reads is there, typed."""
        reply = self.call(op, timeout, body=body, sink=sink, **params)
        return Edge(self.host, op).reply(reply, shape)

    @contextlib.contextmanager
    def dedicated(self) -> Iterator[Agent]:
        """This agent over a session of its own, for bulk bytes: a push or pull holds it as long
        as it needs while polls and stops go on over the usual one."""
        if self.home is None:
            self.install()
        argv = [self.python, "-S", f"{self.agent_dir}/agent.py", "serve"]
        own = Agent(self.transport, python=self.python, workdir=self.workdir)
        own.home, own.absent = self.home, self.absent
        try:
            own._session = self.transport.open_session(argv)
        except SessionEnded as exc:
            self._reply(exc.exit_code, b"", exc.stderr)
            raise
        try:
            # Counted as this agent's call: Ctrl-C on the main thread mid-stream can leave a
            # packet half-written on the connection both sessions share, so Fleet.interrupt must
            # drop that connection and let the stop reconnect.
            with self._request():
                yield own
        finally:
            own.close_session()

    def close_session(self) -> None:
        self._abandoned = False  # what it abandoned goes with it (and with the connection)
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _over(
        self,
        session: Session,
        data: bytes,
        timeout: float | None,
        body: Iterable[bytes] = (),
        sink: Callable[[bytes], None] | None = None,
        op: str = protocol.OP_HELLO,
    ) -> dict[str, Any]:
        try:
            line = session.request(data, timeout, body)
            return self._answer(session, line, timeout, sink, op)
        except SessionEnded as exc:
            self._session = None
            if exc.exit_code == protocol.SERVE_IDLE_EXIT:
                raise _SessionLeft from None
            return self._reply(exc.exit_code, b"", exc.stderr)
        except BaseException:
            # Lost, timed out, or abandoned half-way (Ctrl-C in the middle of a stream): the
            # agent may still be reading this request, so the next one must not follow it there.
            self._session = None
            session.close()
            raise

    def _request_line(self, op: str, params: Mapping[str, Any]) -> bytes:
        request = {"v": protocol.PROTOCOL_VERSION, "op": op, "workdir": self.workdir, **params}
        return json.dumps(request).encode() + b"\n"

    def _answer(
        self,
        session: Session,
        line: bytes,
        timeout: float | None,
        sink: Callable[[bytes], None] | None,
        op: str,
    ) -> dict[str, Any]:
        """A session's reply line as a reply, and the raw bytes after it to `sink`."""
        reply = self._reply(0, line, b"")
        raw = _raw_count(Edge(self.host, op), reply)
        if raw is not None:
            session.read_raw(raw, sink or _discard, timeout)
        return reply

    def _reply(self, exit_code: int, stdout: bytes, stderr: bytes) -> dict[str, Any]:
        if exit_code == 127 or exit_code == TOO_OLD_EXIT:
            raise self._no_interpreter(exit_code, stderr.decode(errors="replace"))
        try:
            reply: dict[str, Any] = json.loads(stdout)
        except ValueError:
            detail = (stderr or stdout).decode(errors="replace").strip()
            last = detail.splitlines()[-1] if detail else f"exit code {exit_code}"
            raise HostError(self.host, f"the tfdeploy agent failed: {text(last)}") from None
        if not reply.get("ok"):  # the host's words: cleaned before they can reach a terminal
            raise HostError(self.host, text(reply.get("error", "the agent refused the request")))
        return reply

    def _no_interpreter(self, exit_code: int, stderr: str) -> HostError:
        """The interpreter is missing, cannot start (its loader's words), or is too old."""
        hint = "set job.python (or python on the host) to an installed interpreter"
        if exit_code == TOO_OLD_EXIT:
            need = ".".join(map(str, MIN_HOST_PYTHON))
            return HostError(
                self.host,
                f"{self.python!r} is Python {text(stderr).strip()}; "
                f"the tfdeploy agent needs Python {need} or newer",
                hint=hint + " (python3.8 to python3.13)",
            )
        lines = [text(line).strip() for line in stderr.splitlines() if line.strip()]
        loader = any("shared librar" in line for line in lines)  # exits 127 too
        if not lines or (
            not loader and all("not found" in x or "No such file" in x for x in lines)
        ):
            return HostError(self.host, f"{self.python!r} was not found on the host", hint=hint)
        said = "\n    ".join(lines[:3])
        return HostError(self.host, f"{self.python!r} cannot start:\n    {said}", hint=hint)

    # The operations of docs/PROTOCOL.md, typed for the rest of the control side.

    def missing(self, hashes: Sequence[str]) -> list[str]:
        request: protocol.HaveRequest = {"hashes": list(hashes)}
        return self.ask(protocol.OP_HAVE, protocol.HaveReply, **request)["missing"]

    def start(
        self, run_id: str, tasks: list[dict[str, Any]], grace: float, *, release: bool = False
    ) -> list[TaskStatus]:
        """`release`: then drop the run's port reservations here (as `release` would)."""
        request: protocol.StartRequest = {"run_id": run_id, "tasks": tasks, "grace": grace}
        if release:
            request["release"] = True
        reply = self.ask(protocol.OP_START, protocol.TasksReply, **request)
        edge = Edge(self.host, protocol.OP_START)
        named = {str(t.get("name")) for t in tasks}
        return [TaskStatus.from_json(t, edge, named) for t in reply["tasks"]]

    def poll(
        self,
        run_id: str,
        offsets: dict[str, int],
        *,
        max_bytes: int = 1 << 20,
        ports: Sequence[int] = (),
        heartbeat: bool = True,
        timeout: float = 30,
    ) -> Poll:
        raw: list[bytes] = []  # every task's new bytes, in the order `logs` lists them
        reply = self._poll(run_id, offsets, max_bytes, raw.append, ports, heartbeat, timeout)
        edge = Edge(self.host, protocol.OP_POLL)
        data, at, logs = b"".join(raw), 0, {}
        for entry in reply["logs"]:
            count = edge.count(entry["bytes"], "a log's bytes")
            name = edge.task(entry["task"], "a log's task", offsets)
            offset = edge.count(entry["offset"], f"{name}'s log offset")
            logs[name] = (offset, data[at : at + count])
            at += count
        return Poll(
            tasks=tuple(TaskStatus.from_json(t, edge) for t in reply["tasks"]),
            logs=logs,
            listening=frozenset(edge.count(p, "a listening port") for p in reply["listening"]),
        )

    def read_log(
        self, run_id: str, task: str, offset: int, max_bytes: int, sink: Callable[[bytes], None]
    ) -> int:
        """One task's log from `offset` (at most `max_bytes`) to `sink` as it arrives, without
        holding it here; returns the offset after it."""
        reply = self._poll(run_id, {task: offset}, max_bytes, sink)
        edge = Edge(self.host, protocol.OP_POLL)
        if not reply["logs"]:
            raise edge.error("logs", f"lack {task}'s")
        return edge.count(reply["logs"][0]["offset"], f"{task}'s log offset")

    def _poll(
        self,
        run_id: str,
        offsets: dict[str, int],
        max_bytes: int,
        sink: Callable[[bytes], None],
        ports: Sequence[int] = (),
        heartbeat: bool = False,
        timeout: float = 30,
    ) -> protocol.PollReply:
        request: protocol.PollRequest = {
            "run_id": run_id,
            "offsets": offsets,
            "max_bytes": max_bytes,
            "ports": list(ports),
            "heartbeat": heartbeat,
        }
        return self.ask(protocol.OP_POLL, protocol.PollReply, timeout, sink=sink, **request)

    def stop(
        self,
        run_id: str,
        *,
        grace: float,
        tasks: Sequence[str] | None = None,
        escaped: bool = False,
    ) -> StopReport:
        """Stops tasks (all: also the run's escaped processes and its port reservations; named
        ones with `escaped`: also the escaped processes, and the run may start again)."""
        request: protocol.StopRequest = {
            "run_id": run_id,
            "grace": grace,
            "tasks": list(tasks) if tasks is not None else None,
            "escaped": escaped,
        }
        # A whole-run stop may take grace twice: the task groups, then escaped processes.
        reply = self.ask(protocol.OP_STOP, protocol.StopReply, 2 * grace + 60, **request)
        edge = Edge(self.host, protocol.OP_STOP)
        return StopReport(
            tasks=tuple(TaskStatus.from_json(t, edge) for t in reply["tasks"]),
            escaped=tuple(
                Escaped(
                    pid=edge.count(e["pid"], "an escaped process's pid"),
                    cmd=text(e["cmd"]),  # its command line, printed by `down`
                    signal=e["signal"],
                )
                # only a whole-run stop, or one asked for them, lists escaped processes
                for e in reply.get("escaped", [])
            ),
        )

    def arm_idle_stop(self, minutes: float, command: str | None = None) -> None:
        """Shut the machine down after `minutes` without a running task (0 disarms). One watchdog
        per host, re-armed by each `up`: it outlives this connection, and the laptop."""
        # looked at every 30 s, or more often for short limits (tests), never under 1 s
        interval = max(1.0, min(30.0, minutes * 6))
        request: protocol.IdleRequest = {"minutes": minutes, "interval": interval}
        if command:
            request["command"] = command
        self.ask(protocol.OP_IDLE, protocol.IdleReply, **request)

    def release(self, run_id: str) -> None:
        """Drops the run's port reservations (preflight failed: nothing of it will start)."""
        request: protocol.RunRequest = {"run_id": run_id}
        self.ask(protocol.OP_RELEASE, protocol.ReleaseReply, **request)

    def setup(
        self,
        run_id: str,
        commands: Sequence[str],
        env: Mapping[str, str],
        fingerprint: str,
        timeout: float = 3600,
    ) -> SetupResult:
        request: protocol.SetupRequest = {
            "run_id": run_id,
            "commands": list(commands),
            "env": dict(env),
            "fingerprint": fingerprint,
        }
        reply = self.ask(protocol.OP_SETUP, protocol.SetupReply, timeout, **request)
        return SetupResult(
            code=reply["code"], ran=reply["ran"], tail=tuple(text(line) for line in reply["tail"])
        )

    def gpus(self) -> dict[str, Any]:
        """The `gpus` reply, its texts cleaned (GPU names, driver words are printed);
        deployer.hosts.gpus.GpuReport.from_json reads it."""
        cleaned: dict[str, Any] = cleaned_texts(self.ask(protocol.OP_GPUS, protocol.GpusReply))
        return cleaned

    def listen(self, run_id: str, ports: Sequence[int], seconds: float) -> None:
        """Stand-in listeners on the planned TF ports, for peers' probes (remote/netcheck.py)."""
        request: protocol.NetcheckRequest = {
            "action": protocol.NETCHECK_LISTEN,
            "run_id": run_id,
            "ports": list(ports),
            "seconds": seconds,
        }
        self.ask(protocol.OP_NETCHECK, protocol.ListenReply, **request)

    def probe(self, run_id: str, targets: Sequence[tuple[str, int]], timeout: float) -> list[str]:
        """One verdict per (address, port): "ok", "refused", "timed out", "no route", ..."""
        request: protocol.NetcheckRequest = {
            "action": protocol.NETCHECK_PROBE,
            "run_id": run_id,
            "targets": [list(t) for t in targets],
            "wait": timeout,
        }
        budget = protocol.probe_budget(len(targets), timeout) + 30  # the host's whole queue
        reply = self.ask(protocol.OP_NETCHECK, protocol.ProbeReply, budget, **request)
        return [text(r) for r in reply["results"]]

    def unlisten(self, run_id: str) -> None:
        request: protocol.NetcheckRequest = {"action": protocol.NETCHECK_CLOSE, "run_id": run_id}
        self.ask(protocol.OP_NETCHECK, protocol.ClosedReply, **request)

    def relay(
        self,
        run_id: str,
        address: str,
        port: int,
        secret: str,
        then: tuple[str, int] | None,
        seconds: float,
    ) -> None:
        """Listens on address:port for the fan-out's one stream, storing it and forwarding every
        piece to `then` as it arrives (remote/peers.py)."""
        request: protocol.PeersRequest = {
            "action": protocol.PEERS_RELAY,
            "run_id": run_id,
            "address": address,
            "port": port,
            "secret": secret,
            "next": list(then) if then is not None else None,
            "seconds": seconds,
        }
        self.ask(protocol.OP_PEERS, protocol.PeersPidReply, **request)

    def stop_serving(self, run_id: str) -> None:
        request: protocol.PeersRequest = {"action": protocol.PEERS_CLOSE, "run_id": run_id}
        self.ask(protocol.OP_PEERS, protocol.ClosedReply, **request)

    def look(self) -> None:
        """Says hello once without creating anything on the host (read-only verbs)."""
        if self.home is None:
            self.install(look_only=True)

    def collect(
        self,
        run_id: str,
        patterns: Sequence[str],
        tasks: Sequence[str] | None = None,
        *,
        hashed: bool = True,
        hash_only: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Collected]:
        """The files each task's `patterns` name on this host, hashed there unless not
        `hashed`, or only the paths `hash_only` names for each task (remote/results)."""
        self.look()
        if self.absent:
            return {}
        request: protocol.CollectRequest = {
            "run_id": run_id,
            "patterns": list(patterns),
            "tasks": list(tasks) if tasks is not None else None,
            "hash": hashed,
        }
        if hash_only is not None:
            request["hash_only"] = {task: list(paths) for task, paths in hash_only.items()}
        # hashing gigabytes of checkpoints takes a while
        reply = self.ask(protocol.OP_COLLECT, protocol.CollectReply, 600, **request)
        edge = Edge(self.host, protocol.OP_COLLECT)
        return {
            edge.task(name, "a task", tasks): Collected.from_json(t, edge, name)
            for name, t in reply["tasks"].items()
        }

    def fetch_each(
        self, run_id: str, patterns: Sequence[str], orders: Iterable[FetchOrder]
    ) -> Generator[tuple[FetchOrder, Fetched], None, None]:
        """Each order's file, from its offset to its end, to its sink as the bytes arrive (raw,
        after the reply line). With a listed size (what collect listed), the host hashes the
        whole file as it sends (its first `offset` bytes too) and says whether it stood still;
        a file whose size is no longer the listed one comes back as not steady. Each wait for
        more bytes may last 60 s.

        The orders go in turn on this agent's session, FETCH_AHEAD requests sent before their
        turn: the host opens and starts hashing the next file while this side still writes the
        last one. One request per file left both sides idle for a round trip between files
        (pulling 30 files from each of 2 lab hosts spent about as long idle as moving bytes).
        An order is taken from `orders` only when its request is sent. Leaving the loop early
        (an error, Ctrl-C) closes the session: requests are pending."""
        session = self._session
        if session is None:
            raise RuntimeError("fetch_each needs a session (Agent.dedicated)")
        pending: collections.deque[_FetchReading] = collections.deque()
        upcoming = iter(orders)
        with session.lock, self._request():
            try:
                while True:
                    while len(pending) < FETCH_AHEAD:
                        order = next(upcoming, None)
                        if order is None:
                            break
                        params = order.params(run_id, patterns)
                        session.send(self._request_line(protocol.OP_FETCH, params))
                        pending.append(_FetchReading(order))
                    if not pending:
                        return
                    reading = pending.popleft()
                    reply = self._answer(
                        session, session.reply(60), 60, reading.sink, protocol.OP_FETCH
                    )
                    edge = Edge(self.host, protocol.OP_FETCH)
                    yield reading.order, reading.fetched(edge.reply(reply, protocol.FetchReply))
            except SessionEnded as exc:  # the agent exited: its stderr says why
                self._session = None
                self._reply(exc.exit_code, b"", exc.stderr)
                raise  # _reply always raises for an ended session
            except BaseException:
                self._session = None
                session.close()
                raise

    def firewall_problem(self) -> str | None:
        """Why the TF port firewall cannot work on this host (no nft/iptables, no root), or None."""
        request: protocol.FirewallRequest = {"action": protocol.FIREWALL_CHECK}
        reply = self.ask(protocol.OP_FIREWALL, protocol.FirewallCheckReply, **request)
        return text(reply["problem"]) if reply["problem"] else None

    def firewall_add(self, run_id: str, ports: Sequence[int], allowed: Sequence[str]) -> None:
        request: protocol.FirewallRequest = {
            "action": protocol.FIREWALL_ADD,
            "run_id": run_id,
            "ports": list(ports),
            "allowed": list(allowed),
        }
        self.ask(protocol.OP_FIREWALL, protocol.FirewallRulesReply, **request)

    def firewall_remove(self, run_id: str) -> int:
        """Removes the run's rules (idempotent); how many rule sets were removed."""
        request: protocol.FirewallRequest = {"action": protocol.FIREWALL_REMOVE, "run_id": run_id}
        return self.ask(protocol.OP_FIREWALL, protocol.FirewallRemoveReply, **request)["removed"]

    def runs(self, hosts_of: str | None = None) -> list[protocol.RunShape]:
        """The runs on the host; the first call of a connection asks in its hello (one round
        trip for both), without creating anything on the host. A run's `hosts` come while it is
        active, and for the run `hosts_of` whatever its state."""
        if self.home is None:
            reply = self.install(look_only=True, runs=True, hosts_of=hosts_of)
            return [] if self.absent else list(reply["runs"])
        if self.absent:
            return []
        request: protocol.RunsRequest = {"hosts_of": hosts_of} if hosts_of else {}
        return list(self.ask(protocol.OP_RUNS, protocol.RunsReply, **request)["runs"])


@dataclass(frozen=True)
class Fetched:
    """What a fetch brought: the content bytes, and for a hashed fetch what the host said."""

    count: int
    sha256: str | None = None  # the whole file's, as the host read it
    steady: bool = True  # the file stood still while the host read it


FETCH_AHEAD = 4  # fetch requests a host holds before their turn (fetch_each)


@dataclass(frozen=True)
class FetchOrder:
    """One file to fetch: where its bytes go, from which offset, and (hashed) its listed size."""

    task: str
    path: str
    offset: int
    sink: Callable[[bytes | memoryview], None]
    listed_size: int | None = None  # set: the host hashes the whole file and says if it stood

    def params(self, run_id: str, patterns: Sequence[str]) -> protocol.FetchRequest:
        return {
            "run_id": run_id,
            "task": self.task,
            "path": self.path,
            "patterns": list(patterns),
            "offset": self.offset,
            "hash": self.listed_size is not None,
        }


class _FetchReading:
    """One fetch's reply being read: the content to the order's sink, the trailer kept."""

    def __init__(self, order: FetchOrder) -> None:
        self.order = order
        self.trailer = bytearray()
        self.content = max(0, (order.listed_size or 0) - order.offset)
        hashed = order.listed_size is not None
        self.sink = _Trailing(order.sink, self.content, self.trailer) if hashed else order.sink

    def fetched(self, reply: protocol.FetchReply) -> Fetched:
        if self.order.listed_size is None:
            return Fetched(reply["raw"])
        count = reply["raw"] - protocol.FETCH_TRAILER
        said = bytes(self.trailer).decode("ascii", "replace")
        if count != self.content or len(said) != protocol.FETCH_TRAILER:  # its size changed
            return Fetched(min(count, self.content), sha256=None, steady=False)
        return Fetched(count, sha256=said[:64], steady=said[64:] == "1")


class _Trailing:
    """A sink for a hashed fetch: the first `content` bytes go on to `sink`, the rest (the
    protocol.FETCH_TRAILER) into `trailer`."""

    def __init__(
        self, sink: Callable[[bytes | memoryview], None], content: int, trailer: bytearray
    ) -> None:
        self.sink, self.left, self.trailer = sink, content, trailer

    def __call__(self, data: bytes) -> None:
        take = min(self.left, len(data))
        if take:
            self.sink(memoryview(data)[:take] if take < len(data) else data)
            self.left -= take
        room = protocol.FETCH_TRAILER + 1 - len(self.trailer)  # one more tells it overflowed
        if room > 0 and take < len(data):
            self.trailer += data[take : take + room]  # a file grown by gigabytes: not kept


def cleaned_texts(value: Any) -> Any:
    """Every string in a reply's JSON (keys too) cleaned as replies.text cleans it: for the
    loosely shaped replies (hello facts, gpus) whose texts reach the terminal in many places."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list):
        return [cleaned_texts(v) for v in value]
    if isinstance(value, dict):
        return {text(k): cleaned_texts(v) for k, v in value.items()}
    return value


def _raw_count(edge: Edge, reply: Mapping[str, Any]) -> int | None:
    """How many raw bytes follow a reply line (poll's logs, fetch's content); None: none."""
    return None if "raw" not in reply else edge.count(reply["raw"], "raw")


def _discard(data: bytes) -> None:
    """Raw bytes nobody asked for are read (the next reply follows them) and dropped."""
