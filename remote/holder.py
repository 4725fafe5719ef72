"""The holder: on a Slurm node, the process that starts what must outlive an agent's session.

Under `reach = "srun"` every agent session is a job step (`srun --overlap ... agent.py serve`)
that ends when the controller's connection does. A cluster that tracks processes with
proctrack/cgroup (most production clusters) kills every process a step started when the step
ends, however it detached: a detached run's tasks died 0.07 s after `up` returned
(docs/slurm.md, "Process tracking: what survives a step"). So the allocation's batch body
starts one more step when the allocation begins, one task per node with every resource the job
holds there (`--whole`), that waits for the agent's code and runs `agent.py hold JOB`: this
process. It lives as long as the allocation; `scancel`, the time limit and the body's own end
still end it and all it started.

An agent whose session was started with TFDEPLOY_HOLDER=JOB (batch.step_launcher) hands the
ops that leave processes behind (`start`: the tasks' supervisors; `keep`: the run's keeper and
warden) to this node's holder of that job instead of running them itself: the holder forks a
child that runs the op with the agent's own `handle` and writes its reply back, so what the op
starts lives in the holder's step. Every other op runs in the session as before.

The holder listens on an abstract unix socket (per network namespace, nothing on disk to leave
behind) named by the user's uid and the job id. Both ends check the other's uid with
SO_PEERCRED: only the user's own processes are served, and an agent never hands its request to
a socket another user bound first.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable

import params
import procs
import protocol

HOLDER_ENV, HELD_OPS = protocol.HOLDER_ENV, protocol.HELD_OPS
WAIT_S = 20.0  # a session's first held op waits this long for the holder to come up
MAX_REQUEST = 64 << 20  # a start's specs (commands, environments) are far smaller
MAX_REPLY = 16 << 20
ACCEPT_S = 1.0  # how often the holder looks for ended children between requests
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def address(job_id: str) -> str:
    """The abstract socket's name ("\\0" first: not a file)."""
    return f"\0tfdeploy-holder-{os.getuid()}-{job_id}"


def job_of(text: str | None) -> str | None:
    """A Slurm job id as the environment or argv gives it; None when it is not one."""
    if text and text.isdigit() and len(text) <= 20:
        return text
    return None


def expected() -> str | None:
    """The job whose holder this session's held ops go to; None: no holder (ssh, no Slurm)."""
    return job_of(os.environ.get(HOLDER_ENV))


# ---- the agent's side ---------------------------------------------------------------------------


def forward(raw: bytes, job_id: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    """The reply of this node's holder to the request `raw`."""
    sock = _connect(job_id, wait_s)
    with sock:
        sock.settimeout(None)  # a start waits for its tasks to start (START_TIMEOUT), no longer
        sock.sendall(raw if raw.endswith(b"\n") else raw + b"\n")
        sock.shutdown(socket.SHUT_WR)
        data = _read_line(sock, MAX_REPLY)
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise params.AgentError(f"the holder of Slurm job {job_id} on this node gave no reply")
    return reply


def _connect(job_id: str, wait_s: float) -> socket.socket:
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address(job_id))
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise params.AgentError(
                    f"no holder of Slurm job {job_id} answers on this node after {wait_s:g} s: "
                    "the allocation's body starts one step per node for it (`srun --overlap "
                    "--whole`); `squeue -s` on the login node shows whether that step runs"
                ) from None
            time.sleep(0.2)
            continue
        uid = peer_uid(sock)
        if uid != os.getuid():
            sock.close()
            raise params.AgentError(
                f"the holder socket of Slurm job {job_id} on this node belongs to uid {uid}, "
                "not to you: nothing was sent to it"
            )
        return sock


# ---- the holder ---------------------------------------------------------------------------------


def main(argv: list[str], handle: Callable[[bytes], dict[str, Any]]) -> int:
    """`agent.py hold JOB [WORKDIR LEASE]`: serves until the allocation ends (Slurm ends the
    step). In a requeued allocation it first rejoins the detached runs it held in WORKDIR
    (rejoin.py), and tells the batch body through LEASE's mode file that a run goes on."""
    job_id = job_of(argv[0] if argv else None)
    if job_id is None or len(argv) not in (1, 3):
        sys.stderr.write("usage: agent.py hold SLURM_JOB_ID [WORKDIR LEASE_FILE]\n")
        return 2
    os.environ.pop(HOLDER_ENV, None)  # its own requests are run here, never handed on
    _adopt_orphans()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(address(job_id))
    except OSError as exc:
        sys.stderr.write(f"tfdeploy holder of job {job_id}: cannot listen: {exc}\n")
        return 1
    server.listen(64)
    server.settimeout(ACCEPT_S)
    if len(argv) == 3:
        _rejoin(job_id, Path(argv[1]), Path(argv[2]))
    while True:
        procs.reap_children()  # the children that answered, and the orphans it adopted
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        with conn:
            if peer_uid(conn) == os.getuid():
                _answer_in_child(server, conn, handle)


def _rejoin(job_id: str, workdir: Path, lease: Path) -> None:
    """After a requeue: the wardens and keeper of each detached run this node held, started
    again here (the keeper restarts the job by its policy); the body, whose mode file the
    requeue removed, is told the allocation holds a detached run again (it then ends the
    allocation once no task is left, instead of waiting for a controller's lease)."""
    import rejoin

    if not rejoin.requeued():
        return
    import keeper  # only a requeued holder pays for these imports
    import warden

    rejoined = 0
    for run_dir, asked in rejoin.runs_to_rejoin(workdir, job_id):
        base = {"v": protocol.PROTOCOL_VERSION, "op": protocol.OP_KEEP, "workdir": str(workdir)}
        try:
            warden.start({**base, **asked[protocol.KEEP_WARDEN]})
            if protocol.KEEP_KEEPER in asked:
                keeper.start({**base, **asked[protocol.KEEP_KEEPER]}, requeued_job=job_id)
        except (params.AgentError, OSError) as exc:
            sys.stderr.write(f"tfdeploy holder: run {run_dir.name} not rejoined: {exc}\n")
            continue
        rejoined += 1
    if rejoined and lease.exists():  # the batch body's node: its lease file is here
        with contextlib.suppress(OSError):
            lease.with_name(lease.name + ".mode").write_text("detached\n")


def _answer_in_child(
    server: socket.socket, conn: socket.socket, handle: Callable[[bytes], dict[str, Any]]
) -> None:
    """A child reads, runs and answers the request: what the op starts is the holder's
    descendant (in its step), and a slow start does not hold up the next request. The reply
    is one line, read up to its end: a keeper or warden the op detached holds a copy of this
    connection (a server keeps the descriptors it was given), so its end never comes."""
    if os.fork() != 0:
        return
    try:  # pragma: no cover - runs in the forked child
        server.close()  # nothing the op starts may keep the holder's name bound
        conn.settimeout(30.0)
        raw = _read_all(conn, MAX_REQUEST)
        reply = _held_reply(raw, handle)
        conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.shutdown(socket.SHUT_RDWR)
    finally:
        os._exit(0)


def _held_reply(raw: bytes, handle: Callable[[bytes], dict[str, Any]]) -> dict[str, Any]:
    try:
        op = json.loads(raw).get("op")
    except (ValueError, AttributeError):
        op = None
    if op not in HELD_OPS:
        return {
            "v": protocol.PROTOCOL_VERSION,
            "ok": False,
            "error": f"a holder runs only {', '.join(HELD_OPS)}",
            "code": protocol.FAIL_REFUSED,
        }
    try:
        return handle(raw)
    except Exception as exc:  # the holder outlives any one request
        return {
            "v": protocol.PROTOCOL_VERSION,
            "ok": False,
            "code": protocol.FAIL_REFUSED,
            "error": f"the holder failed: {type(exc).__name__}: {exc}",
        }


def _adopt_orphans() -> None:
    """The holder becomes its descendants' reaper (PR_SET_CHILD_SUBREAPER): a supervisor or
    keeper whose parent exited is re-parented to it, not to init, so it stays in the holder's
    process tree. proctrack/linuxproc follows that tree, so `scancel` and the time limit end
    them there too, as proctrack/cgroup does by the step's cgroup. Not Linux, or refused:
    cgroup tracking still holds them; linuxproc loses them as it lost the sessions' tasks."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def peer_uid(sock: socket.socket) -> int:
    uid: int
    _pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return uid


def _read_all(sock: socket.socket, limit: int) -> bytes:
    """What the peer sends until it shuts its side, at most `limit` bytes."""
    return _read_line(sock, limit, to_end=True)


def _read_line(sock: socket.socket, limit: int, *, to_end: bool = False) -> bytes:
    """The peer's bytes up to the end of a line (`to_end`: of the stream), at most `limit`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise params.AgentError(f"more than {limit} bytes on the holder's socket")
        chunks.append(chunk)
        if not to_end and chunk.endswith(b"\n"):
            return b"".join(chunks)
