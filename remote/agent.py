"""tfdeploy's remote agent: one JSON request on stdin, one JSON reply on stdout (PROTOCOL.md)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Tuple

import hostfacts
import hostid
import layout
import params
import procs
import protocol
import reservations
import taskmetrics

CONNECT_TIMEOUT = 0.2
DEFAULT_MAX_BYTES = 256 * 1024

if TYPE_CHECKING:
    from typing import TypedDict

    class _HelloAsked(TypedDict, total=False):
        """What a hello's request asked for beyond the host's facts (fields of HelloReply)."""

        runs: list[protocol.RunShape]
        nvidia_smi: bool
        listening: int
        interpreters: protocol.InterpretersShape
        attempt: int  # asked with `resume`: op_hello adds it once the reply is made

    class _Polled(protocol.PollReply, protocol.RawBody):
        """A poll's reply, and what sends the log bytes it counts (when there are any)."""


def op_hello(req: dict[str, Any]) -> protocol.HelloReply:
    workdir = layout.workdir_path(req)
    ports = _ports(req, "ports")  # a refused request must create nothing: check first
    run_id = params.param(req, "run_id", str, None)
    lease = params.param(req, "lease_seconds", (int, float), None)
    job = params.param(req, "job", str, None)  # named in the reservation: `down INVENTORY`
    if run_id is not None:
        run_id = params.check_name(run_id, "run id")
    layout.make_private_dir(workdir)
    layout.make_private_dir(layout.host_dir(workdir))
    others = hostid.announce(workdir / "hosts", hostid.identity())
    with_runs = params.param(req, "runs", bool, False)
    resuming = params.param(req, "resume", bool, False)
    attempt = _resumable(workdir, run_id, job) if run_id and resuming else None
    held: dict[int, str]
    if run_id is None:
        busy, held = [p for p in ports if not _bindable(p)], {}
    else:
        busy, held = reservations.reserve(
            workdir, run_id, ports, lease, _bindable, job, resuming=resuming
        )
    try:
        reply = _hello_reply(req, workdir, run_id, busy, held, others, with_runs)
        if run_id is not None and attempt is not None:  # `up --resume`: the run is its again
            _reopen(workdir, run_id, busy)
            reply["attempt"] = attempt
        return reply
    except BaseException:
        # A hello that fails after reserving answers ok:false, and its `up` then releases
        # nothing here (it holds no reply): what it reserved goes with it.
        if run_id is not None and not busy:
            reservations.release(workdir, run_id)
        raise


def _resumable(workdir: Path, run_id: str, job: str | None) -> int:
    """`up --resume`: the run's last attempt here, or why it cannot be resumed (resume.py)."""
    import resume

    return resume.check(workdir, run_id, job)


def _reopen(workdir: Path, run_id: str, busy: list[int]) -> None:
    """A resuming hello whose ports were reserved lifts the run's stop (resume.py)."""
    if not busy:
        import resume

        resume.reopen(workdir, run_id)


def _hello_reply(
    req: dict[str, Any],
    workdir: Path,
    run_id: str | None,
    busy: list[int],
    held: dict[int, str],
    others: list[str],
    with_runs: bool,
) -> protocol.HelloReply:
    # `runs`: the reply carries what op_runs would (status, down): one round trip less.
    extra: _HelloAsked = {}
    if with_runs:
        extra["runs"] = op_runs(req)["runs"]
        extra["nvidia_smi"] = hostfacts.nvidia_smi() is not None
    listen = params.param(req, "listen", dict, None)
    if listen is not None and run_id is not None and not busy:
        # The network check's stand-ins, started here instead of in a round of their own.
        import netcheck

        record = layout.netcheck_record(req, run_id)
        extra["listening"] = netcheck.listen_as_asked(record, listen, owned=True)
    asked = params.param(req, "interpreters", dict, None)
    if asked is not None:  # preflight's interpreter rule, for a job without requirements
        extra["interpreters"] = _interpreters(asked)
    return {
        **extra,
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        # Which interpreter that is: a venv's python resolves to its base's binary, so the
        # prefix tells them apart (both go into the job's environment identity).
        "executable": os.path.realpath(sys.executable),
        "prefix": hostfacts.prefix(),
        "machine": os.uname().machine,
        "glibc": hostfacts.glibc(),
        "tensorflow": hostfacts.tensorflow_version(),
        "frameworks": hostfacts.framework_versions(),
        "workdir": str(workdir),
        "disk_free": _free_bytes(workdir),
        "store_empty": _store_empty(workdir),
        "busy_ports": busy,
        "reserved_by": {str(port): holder for port, holder in held.items()},
        "reserved_state": {str(p): reservations.state(workdir, h) for p, h in held.items()},
        "agent_id": layout.agent_id(),
        "host_id": hostid.identity(),
        "shared_with": others,
    }


def _interpreters(asked: dict[str, Any]) -> protocol.InterpretersShape:
    """The task's interpreter against the hello's: tasks get the configured python's directory
    first on PATH (interpreters.host_python_env), so their first words are looked up there."""
    import interpreters

    python = params.param(asked, "python", str)
    words = params.param(asked, "words", list, [])
    if not all(isinstance(w, str) for w in words):
        raise params.AgentError("interpreters.words must be strings")
    path = interpreters.host_python_env(python, os.environ).get("PATH")
    return interpreters.answer(python, words, path)


def _store_empty(workdir: Path) -> bool:
    """No content stored here yet (a first deploy): such a host lacks every content, and the
    push need not ask it which (a round trip less). Anything in the store, a partial file
    too, counts as not empty."""
    try:
        with os.scandir(workdir / "store") as entries:
            return next(entries, None) is None
    except FileNotFoundError:
        return True


def _free_bytes(path: Path) -> int:
    """What shutil.disk_usage says is free, without shutil's imports (bz2, lzma, fnmatch)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _ports(req: dict[str, Any], key: str) -> list[int]:
    ports: list[int] = params.param(req, key, list, [])
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise params.AgentError(f"{key} must be TCP port numbers (1-65535), got {port!r:.40}")
    return ports


def _bindable(port: int) -> bool:
    """TF servers bind the wildcard address, so that is the bind that must succeed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT):
            return True
    except OSError:
        return False


def op_poll(req: dict[str, Any]) -> _Polled:
    """Task states, and what each task logged since its `offsets`: raw bytes after the reply
    line (`logs` says whose and how many, in order). Raw, not base64 in the JSON: catching up a
    300 MB log spent more time encoding, parsing and decoding than moving it."""
    run_dir = layout.run_path(req)
    if params.param(req, "heartbeat", bool, False):
        layout.touch(run_dir / "lease")
    offsets = params.param(req, "offsets", dict, {})
    max_bytes = params.param(req, "max_bytes", int, DEFAULT_MAX_BYTES)
    if max_bytes < 0:
        raise params.AgentError(f"max_bytes must be zero or more, got {max_bytes}")
    ranges = _log_ranges(run_dir, offsets, max_bytes)
    logs: list[protocol.LogShape] = [
        {"task": name, "offset": at + count, "bytes": count} for name, _, at, count in ranges
    ]
    statuses = procs.run_statuses(run_dir)
    taskmetrics.add_usage(statuses)
    reply: _Polled = {
        "tasks": statuses,
        "logs": logs,
        "listening": [p for p in _ports(req, "ports") if _listening(p)],
    }
    metric_offsets = params.param(req, "metrics", dict, None)
    if metric_offsets is not None:
        reply["metrics"] = taskmetrics.read_metrics(
            run_dir, metric_offsets, taskmetrics.DEFAULT_BUDGET
        )
    total = sum(count for _, _, _, count in ranges)
    if total:
        reply.update({"raw": total, protocol.RAW_BODY: lambda out: _send_logs(out, ranges)})
    return reply


LogRange = Tuple[str, Path, int, int]  # task name, its log, offset, byte count


def _log_ranges(run_dir: Path, offsets: dict[str, Any], max_bytes: int) -> list[LogRange]:
    paths, starts, wants = [], [], []
    for name, offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise params.AgentError(
                f"the log offset of {name} must be a byte count, got {offset!r}"
            )
        path = run_dir / "tasks" / params.task_dirname(name) / "output.log"
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        paths.append(path)
        starts.append(offset)
        wants.append(max(0, size - offset))
    shares = fair_shares(wants, max_bytes)
    return list(zip(offsets, paths, starts, shares))


def _send_logs(out: Any, ranges: list[LogRange]) -> None:
    import results  # only when there are bytes: most polls of a quiet run have none

    for _, path, start, count in ranges:
        if count:
            results.send_range(out, path, start, count)


def fair_shares(wants: list[int], budget: int) -> list[int]:
    """Split budget so a chatty task cannot starve a quiet one: small wants are met first."""
    shares = [0] * len(wants)
    left = budget
    order = sorted(range(len(wants)), key=wants.__getitem__)
    for rank, index in enumerate(order):
        shares[index] = min(wants[index], left // (len(order) - rank))
        left -= shares[index]
    return shares


def op_runs(req: dict[str, Any]) -> protocol.RunsReply:
    """Every run here. A run's list of all its hosts comes only while it is active, or for the
    run named by `hosts_of`: each host holds every run it ever ran, and N hosts' lists of N
    hosts for every old run made `status` and `down` fetch N² x runs of history."""
    workdir = layout.workdir_path(req)
    root = layout.runs_dir(workdir)
    hosts_of = params.param(req, "hosts_of", str, None)
    found = [_claimed(run_id, c) for run_id, c in reservations.claims(workdir).items()]
    preparing = reservations.reserving_runs(workdir)  # a resumed run: starting again
    now = time.time()
    for run_dir in root.iterdir() if root.is_dir() else []:
        if not run_dir.is_dir():
            continue
        meta = layout.read_json(run_dir / "run.json")
        if not isinstance(meta, dict) and layout.run_stopped(run_dir):
            continue  # stopped before its code came (`down` during a push): nothing ran
        meta = meta if isinstance(meta, dict) else {}
        created = meta.get("created")
        if not isinstance(created, (int, float)):
            created = run_dir.stat().st_mtime  # half-written run: its directory's age will do
        tasks = procs.run_statuses(run_dir)
        leased = layout.lease_held(run_dir, meta, now)  # its up (or keeper) holds it
        ended = (protocol.STATE_EXITED, protocol.STATE_LOST)
        listed = run_dir.name == hosts_of or any(t.get("state") not in ended for t in tasks)
        if listed:  # an active run (or the one asked for): its progress and resources
            taskmetrics.add_usage(tasks)
            taskmetrics.add_last(run_dir, tasks)
        found.append(
            {
                "run_id": run_dir.name,
                "job": meta.get("job"),
                "created": created,
                "detached": meta.get("detached"),
                "hosts": meta.get("hosts") if listed else None,
                "hosts_at": meta.get("hosts_at") if listed else None,
                "tasks": tasks,
                # Its `up` prepares it: no task yet, or (`up --resume`) its ports reserved
                # again and none of its tasks running (`down INVENTORY` stops it meanwhile).
                "starting": (not tasks and leased)
                or (run_dir.name in preparing and all(t.get("state") in ended for t in tasks)),
                "kept": _kept(workdir, run_dir.name),
                "leased": leased,
                **_recoveries(run_dir),
            }
        )
    return {"runs": sorted(found, key=lambda r: r["created"], reverse=True)}


def _recoveries(run_dir: Path) -> protocol.RecoveredShape:
    """The keeper's restarts of the run, where it kept its record (this host ran it): their
    count, and the newest of them; and why its guard stopped the run, if one did."""
    if not (run_dir / "keeper.json").is_file():
        return {"restarts": 0, "recoveries": []}
    import keeper

    count, newest = keeper.recoveries(run_dir)
    found: protocol.RecoveredShape = {"restarts": count, "recoveries": newest}
    why = keeper.guard_stop(run_dir)
    if why is not None:
        found["guard_stop"] = why
    return found


def _kept(workdir: Path, run_id: str) -> bool:
    """The run's keeper or warden lives here (a kept run between two attempts is not over)."""
    import kept

    return kept.alive(workdir, run_id)


def _claimed(run_id: str, claim: dict[str, Any]) -> protocol.RunShape:
    """A run whose `up` reserved its ports here and is pushing its code: no folder yet."""
    return {
        "run_id": run_id,
        "job": claim["job"],
        "created": claim["reserved"],
        "detached": False,
        "hosts": None,
        "hosts_at": None,
        "tasks": [],
        "starting": True,
    }


def op_release(req: dict[str, Any]) -> protocol.ReleaseReply:
    """Nothing more of the run starts here now: its port reservations go to its tasks until they
    bind (gone at once where none runs), and the network check's stand-ins go if a failed
    preflight left them (one round trip for both)."""
    import daemon  # only a release pays for it: a hello, each connection's first request, never

    run_id = params.check_name(params.param(req, "run_id", str), "run id")
    daemon.stop_stand_ins(req, run_id)
    return {"released": reservations.hand_over(layout.workdir_path(req), run_id)}


def op_detach(req: dict[str, Any]) -> protocol.DetachReply:
    """The run outlives its controller from now on: its lease is dropped. A detached `up`
    holds the lease while it starts the run (SIGKILLed half-way, nothing is left running)
    and sends this as it returns."""
    layout.drop_lease(layout.run_path(req))
    return {"detached": True}


def _deferred(module: str, name: str) -> Callable[[dict[str, Any]], Mapping[str, object]]:
    """The op `name` of `module`, imported when that op first runs: a hello, every
    connection's first request, pays for none of these modules' imports."""

    def op(req: dict[str, Any]) -> Mapping[str, object]:
        function: Callable[[dict[str, Any]], Mapping[str, object]]
        function = getattr(__import__(module), name)
        return function(req)

    return op


def op_peers(req: dict[str, Any]) -> Mapping[str, object]:
    """The peers op's reply (protocol.PeersReply); a relay's with THEN."""
    import peers  # only a fan-out push pays for its imports

    reply = peers.op_peers(req)
    if req.get("action") == protocol.PEERS_RELAY:
        return {**reply, THEN: _ready_to_start}
    return reply


def _ready_to_start() -> None:
    """A relay's host is idle while the fan-out's stream passes through its listener, and the
    run's start comes next: what the start op imports is imported now, not in that round
    (on hosts that share CPUs, as the lab's do, every host's imports were in it at once)."""
    import supervisor  # noqa: F401
    import taskops  # noqa: F401


# Each op: its request (a JSON object, each field checked as it is read: params.param) to its
# reply, a shape of protocol.py (and RAW_BODY or THEN, which are never sent).
OPS: dict[str, Callable[[dict[str, Any]], Mapping[str, object]]] = {
    protocol.OP_HELLO: op_hello,
    protocol.OP_HAVE: _deferred("store", "op_have"),
    protocol.OP_MATERIALIZE: _deferred("store", "op_materialize"),
    protocol.OP_SETUP: _deferred("jobsetup", "op_setup"),
    protocol.OP_START: _deferred("taskops", "op_start"),
    protocol.OP_POLL: op_poll,
    protocol.OP_STOP: _deferred("taskops", "op_stop"),
    protocol.OP_RUNS: op_runs,
    protocol.OP_RELEASE: op_release,
    protocol.OP_DETACH: op_detach,
    protocol.OP_GPUS: _deferred("gpuinfo", "op_gpus"),
    protocol.OP_FIREWALL: _deferred("firewall", "op_firewall"),
    protocol.OP_NETCHECK: _deferred("netcheck", "op_netcheck"),
    protocol.OP_COLLECT: _deferred("results", "op_collect"),
    protocol.OP_FETCH: _deferred("results", "op_fetch"),
    protocol.OP_IDLE: _deferred("idle", "op_idle"),
    protocol.OP_PEERS: op_peers,
    protocol.OP_PRUNE: _deferred("prune", "op_prune"),
    protocol.OP_ENVIRONMENT: _deferred("envop", "op_env"),
    protocol.OP_IMAGE: _deferred("imageop", "op_image"),
    protocol.OP_ENV_PROGRESS: _deferred("envop", "op_env_progress"),
    protocol.OP_KEEP: _deferred("keeper", "op_keep"),
    protocol.OP_PROFILE: _deferred("profiling", "op_profile"),
}


def handle(raw: bytes) -> dict[str, Any]:
    """One request to one reply; request mistakes become ok:false, never a traceback."""
    try:
        req = json.loads(raw)
    except ValueError as exc:
        return _error(f"the request is not valid JSON: {exc}")
    if not isinstance(req, dict):
        return _error("the request must be a JSON object")
    if req.get("v") != protocol.PROTOCOL_VERSION:
        return _error(f"agent speaks protocol {protocol.PROTOCOL_VERSION}, got {req.get('v')!r}")
    op = OPS.get(req.get("op"))  # type: ignore[arg-type]
    if op is None:
        return _error(f"unknown op {req.get('op')!r}; known ops: {', '.join(OPS)}")
    held = _held_by(req)
    if held is not None:
        return _forwarded(raw, held)
    try:
        result = op(req)
    except params.StreamError as exc:
        return {**_error(str(exc), exc.code, exc.subject), END_SESSION: True}
    except params.AgentError as exc:
        return _error(str(exc), exc.code, exc.subject)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        return _error(f"op {req['op']} failed on this host: {exc.strerror or exc}{where}")
    return {"v": protocol.PROTOCOL_VERSION, "ok": True, **result}


def _held_by(req: dict[str, Any]) -> str | None:
    """The Slurm job whose holder runs this request (holder.py): an op that leaves processes
    behind, in a session started as a step (reach = "srun"); None: this session runs it."""
    if req.get("op") not in protocol.HELD_OPS:
        return None
    import holder

    return holder.expected()


def _forwarded(raw: bytes, job_id: str) -> dict[str, Any]:
    import holder

    try:
        return holder.forward(raw, job_id)
    except params.AgentError as exc:
        return _error(str(exc), exc.code, exc.subject)
    except OSError as exc:
        return _error(f"the holder of Slurm job {job_id} on this node failed to answer: {exc}")


END_SESSION = "_end_session"  # never sent: a reply after which `serve` stops reading stdin
THEN = "_then"  # never sent: what a session does once the reply is out (a one-shot call: nothing)


def _error(
    message: str, code: str = protocol.FAIL_REFUSED, subject: str | None = None
) -> dict[str, Any]:
    reply: dict[str, Any] = {"v": protocol.PROTOCOL_VERSION, "ok": False, "error": message}
    reply["code"] = code
    if subject is not None:
        reply["subject"] = subject
    return reply


F_SETPIPE_SZ = 1031  # Linux's fcntl; the module names it only from Python 3.10
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size for unprivileged users


def widen_pipes() -> None:
    """sshd hands a session its stdin and stdout as pipes of 64 KiB. Bulk bytes go through
    them in 1 MiB pieces, each hashed: while this process hashed one, sshd could pass on only
    64 KiB more, and the stream stalled on both sides (a pull ran at ~70% of what the cores
    allowed). With 1 MiB pipes sshd keeps sending while the next piece is hashed. Not a
    pipe, not Linux, or over the user's pipe quota: they stay as they are."""
    try:
        import fcntl
    except ImportError:
        return
    for fd in (0, 1):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)


def serve(first: bytes | None = None) -> int:
    """`agent.py serve`: many requests on one channel, one JSON line in, one JSON line out.

    The interpreter and its imports cost ~50 ms of host CPU per one-shot call; a session pays
    them once per connection. Ends when stdin closes (the controller or its connection left),
    or after SERVE_IDLE_S (protocol.py) without a request (see _IdleExit).
    """
    import caller

    caller.serving = True  # stdin stays open between requests: its end means the caller left
    widen_pipes()
    idle = _IdleExit()
    raw = first
    while True:
        if raw is None:
            raw = sys.stdin.buffer.readline()
            if not raw:
                return 0
        with idle.busy():
            procs.reap_children()
            try:
                reply = handle(raw)
            except Exception as exc:  # a one-shot call would crash; a session must go on
                reply = _error(f"the agent failed: {type(exc).__name__}: {exc}")
            ends = reply.pop(END_SESSION, False)
            then = reply.pop(THEN, None)
            answered = _answer(reply)
            if answered and then is not None:
                with contextlib.suppress(Exception):  # a head start only: the op that needs
                    then()  # it fails there, with its own words, if this did
            procs.reap_children()
        if ends or not answered:
            return 1
        raw = None


class _IdleExit:
    """Ends a session nobody has used for SERVE_IDLE_S.

    A cut link leaves the host's end of the connection open for hours (sshd's TCP keepalive is
    the kernel's 2 h), and the session with it: an orphan process of tfdeploy. The controller
    polls every fraction of a second while a run is watched, so a silent session is a dead one.
    The exit never interrupts a request: a request read but not yet answered holds the lock,
    and one that arrives as the session leaves is unanswered, which the client retries one-shot.
    """

    def __init__(self) -> None:
        import threading
        import time

        self._time = time.monotonic
        limit = os.environ.get(protocol.SERVE_IDLE_ENV)  # tests
        self._limit = float(limit or protocol.SERVE_IDLE_S)
        self._lock = threading.Lock()
        self._last = self._time()
        threading.Thread(target=self._watch, daemon=True).start()

    def busy(self) -> Any:
        import contextlib

        @contextlib.contextmanager
        def held() -> Any:
            with self._lock:
                yield
                self._last = self._time()

        return held()

    def _watch(self) -> None:
        import time

        while True:
            time.sleep(1.0)
            with self._lock:
                if self._time() - self._last > self._limit:
                    sys.stdout.flush()
                    os._exit(protocol.SERVE_IDLE_EXIT)


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] == "idle-watch":
        import idle  # the detached idle watchdog (idle.py), started by the idle op

        return idle.main(argv[2:])
    if len(argv) > 1 and argv[1] == "signal-tasks":
        import relay  # a scheduler's warning signal, passed to one allocation's tasks (relay.py)

        return relay.main(argv[2:])
    if len(argv) > 1 and argv[1] == "serve":
        return serve()
    if len(argv) > 1 and argv[1] == "hold":
        import holder  # a Slurm node's holder step (holder.py), started by the batch body

        return holder.main(argv[2:], handle)
    # The request is one JSON line; materialize's file contents (blobs) may follow it raw.
    raw = sys.stdin.buffer.readline()
    if not raw.endswith(b"\n"):
        raw += sys.stdin.buffer.read()
    reply = handle(raw)
    reply.pop(END_SESSION, None)
    reply.pop(THEN, None)
    _answer(reply)
    return 0


def _answer(reply: dict[str, Any]) -> bool:
    """The reply line, then the raw bytes an op sends after it (`fetch`): the reply's "raw"
    says how many, so the controller reads exactly those and the next reply line after them.
    False when the controller went away (nobody reads stdout any more): the agent ends."""
    body = reply.pop(protocol.RAW_BODY, None)
    try:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if body is not None:
            body(sys.stdout.buffer)
            sys.stdout.buffer.flush()
    except BrokenPipeError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
