"""How the control side reaches one host's agent: the bootstrap's session (install), one-shot
calls when it is busy or gone, a dedicated session for bulk bytes, and the reply line read at the
edge (deployer/hosts/replies.py). Agent (deployer/hosts/agent.py) adds one typed method per op.

Every call is one command on the host's existing connection with the request on stdin, so secrets
never appear on a command line and a call costs one round trip.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Self, TypeVar

from deployer.core.errors import HostError
from deployer.hosts.bootstrap import (
    BOOTSTRAP,
    MIN_HOST_PYTHON,
    TOO_OLD_EXIT,
    agent_files_message,
    agent_id,
)
from deployer.hosts.ops import Op
from deployer.hosts.replies import Edge, failure, text
from deployer.hosts.transport import Session, SessionEnded, Transport
from remote import protocol

Shape = TypeVar("Shape")
RequestT = TypeVar("RequestT")


class _SessionLeft(Exception):
    """The host's session ended while idle; the request was never read, so resending is safe."""


class Channel:
    """The link to the agent on one host, through that host's transport."""

    def __init__(self, transport: Transport, *, python: str, workdir: str) -> None:
        self.transport = transport
        self.python = python
        self.workdir = workdir
        self.home: str | None = None  # absolute workdir, known after install()
        self.absent = False  # look_in() found no workdir: the host has no runs
        self.nvidia_smi: bool | None = None  # a hello with `runs` says; None: not asked yet
        # The last hello's reply arrived, whatever it held (the edge may refuse it): the host
        # may hold what that hello reserved, so a failed `up` releases it (preflight.py).
        self.replied = False
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

    def look_in(
        self, *, runs: bool = False, hosts_of: str | None = None
    ) -> protocol.HelloReply | None:
        """The hello of a verb that only looks (status, logs, down, prune): it creates nothing
        on the host, and a host without the workdir holds no run and answers None
        (`self.absent`), its bootstrap gone."""
        return self._hello((), look_only=True, runs=runs, hosts_of=hosts_of)

    def install(
        self,
        ports: Sequence[int] = (),
        *,
        run_id: str | None = None,
        lease_seconds: float | None = None,
        runs: bool = False,
        hosts_of: str | None = None,
        listen: tuple[Sequence[int], float] | None = None,
        interpreters: protocol.InterpretersQuery | None = None,
        job: str | None = None,
        resume: bool = False,
    ) -> protocol.HelloReply:
        """Installs this agent version if the host lacks it and returns the `hello` facts,
        checked at the edge as protocol.HelloReply.

        With a run id, the free `ports` are reserved for that run on the host until it stops or
        its lease lapses (`lease_seconds` without a heartbeat): two `up` of one inventory started
        at once cannot both pass preflight. Ports reserved by another run come back busy.
        `job` is kept with the reservation: until its code arrives, the run is that record
        (`down INVENTORY` finds and stops it, and the host then refuses the rest of it).
        `resume` (`up --resume`): the run is there and has ended; the host checks it can be
        resumed, lifts its stop and answers its last `attempt`.
        """
        facts = self._hello(
            ports,
            look_only=False,
            run_id=run_id,
            lease_seconds=lease_seconds,
            runs=runs,
            hosts_of=hosts_of,
            listen=listen,
            interpreters=interpreters,
            job=job,
            resume=resume,
        )
        if facts is None:  # only a look_only hello may find no workdir: the edge's to refuse
            raise Edge(self.host, protocol.OP_HELLO).error("absent", "answered a hello to install")
        return facts

    def _hello(
        self,
        ports: Sequence[int],
        *,
        look_only: bool,
        run_id: str | None = None,
        lease_seconds: float | None = None,
        runs: bool = False,
        hosts_of: str | None = None,
        listen: tuple[Sequence[int], float] | None = None,
        interpreters: protocol.InterpretersQuery | None = None,
        job: str | None = None,
        resume: bool = False,
    ) -> protocol.HelloReply | None:
        hello: protocol.HelloRequest = {"ports": list(ports)}
        if run_id is not None:
            hello["run_id"], hello["lease_seconds"] = run_id, lease_seconds
            if job is not None:
                hello["job"] = job
            if resume:
                hello["resume"] = True
            if listen is not None:  # the network check's stand-ins, when no port is busy
                hello["listen"] = {"ports": list(listen[0]), "seconds": listen[1]}
        if interpreters is not None:
            hello["interpreters"] = interpreters
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
        argv = [self.python, "-S", "-c", BOOTSTRAP]
        self.close_session()
        self.replied = False
        try:
            session = self.transport.open_session(argv)
        except SessionEnded as exc:
            self._reply(exc.exit_code, b"", exc.stderr)
            raise  # _reply always raises for an ended session
        self._session = session
        with session.lock, self._request():
            reply = self._over(session, json.dumps(payload).encode() + b"\n", 60)
            if reply.get(protocol.BOOTSTRAP_NEEDS_FILES):  # a host without this agent version
                reply = self._over(session, agent_files_message(), 60)
        self.replied = True
        edge = Edge(self.host, protocol.OP_HELLO)
        # The hello's facts (versions, host names, ids, problems) are printed by preflight and
        # status, and its versions make platform tags: parsed, bounded and cleaned at the edge.
        if reply.get("absent") is True and look_only:  # the host has no workdir
            self.home, self.absent = edge.reply(reply, protocol.AbsentReply)["workdir"], True
            self.close_session()  # the bootstrap answered and left: nothing is installed
            return None
        facts = edge.reply(reply, protocol.HelloReply)
        if runs:
            edge.get(facts, "runs")
        self.home, self.absent = facts["workdir"], False
        if "nvidia_smi" in facts:
            self.nvidia_smi = facts["nvidia_smi"]
        return facts

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
        op: Op[RequestT, Shape],
        request: RequestT,
        timeout: float | None = 60,
        *,
        body: Iterable[bytes] = (),
        sink: Callable[[bytes], None] | None = None,
    ) -> Shape:
        """One op with its request (its shape: ops.py), whose reply is checked against the
        op's reply shape at the edge (deployer/hosts/replies.py): what the rest of the
        control side reads is there, typed."""
        params: Mapping[str, Any] = request  # type: ignore[assignment]  # a TypedDict
        reply = self.call(op.name, timeout, body=body, sink=sink, **params)
        return Edge(self.host, op.name).reply(reply, op.reply)

    @contextlib.contextmanager
    def dedicated(self) -> Iterator[Self]:
        """This agent over a session of its own, for bulk bytes: a push or pull holds it as long
        as it needs while polls and stops go on over the usual one."""
        if self.home is None:
            self.install()
        argv = [self.python, "-S", f"{self.agent_dir}/agent.py", "serve"]
        own = type(self)(self.transport, python=self.python, workdir=self.workdir)
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
        except (ValueError, RecursionError):  # a host's line nested 1,000 deep is no reply
            detail = (stderr or stdout).decode(errors="replace").strip()
            last = detail.splitlines()[-1] if detail else f"exit code {exit_code}"
            raise HostError(self.host, f"the tfdeploy agent failed: {text(last)[:300]}") from None
        if not isinstance(reply, dict):
            raise HostError(
                self.host, f"the tfdeploy agent's reply is {type(reply).__name__}, not an object"
            )
        if not reply.get("ok"):
            raise failure(self.host, reply)
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


def _raw_count(edge: Edge, reply: Mapping[str, Any]) -> int | None:
    """How many raw bytes follow a reply line (poll's logs, fetch's content); None: none."""
    return None if "raw" not in reply else edge.count(reply["raw"], "raw")


def _discard(data: bytes) -> None:
    """Raw bytes nobody asked for are read (the next reply follows them) and dropped."""
