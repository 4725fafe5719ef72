"""Pushes the job's code: only contents a host's store lacks travel, so re-deploys send nothing.

Each host keeps a content store (WORKDIR/store/<sha256>); a run's code directory is hard-linked
from it. Unchanged files therefore cost one hash lookup, not a transfer.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pathspec

from deployer.config.model import Job
from deployer.core.errors import HostError, InventoryError, TfdeployError
from deployer.core.secrets import mask_text
from deployer.core.statedir import state_dir
from deployer.core.text import human_size
from deployer.envs.damaged import damaged
from deployer.hosts import ops
from deployer.hosts.agent import Agent
from deployer.hosts.fleet import Fleet, Member
from deployer.push.hashcache import HashCache, stamp_of
from remote import protocol

IGNORE_FILES = (".gitignore", ".tfdeployignore")
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".tfdeployignore")


@dataclass(frozen=True)
class CodeFile:
    path: str  # relative, '/'-separated
    sha256: str
    mode: int
    size: int


@dataclass(frozen=True)
class Manifest:
    """The code's files, and `extras`: contents that travel with them into hosts' stores but
    are placed in no code directory (the job's wheels, image layers; their `path` is absolute,
    read from this machine's caches). `needs`: the extras each host must hold (its own
    environments' wheels, its image's layers), by host name; a host not named needs them all."""

    root: Path
    files: tuple[CodeFile, ...]
    extras: tuple[CodeFile, ...] = ()
    needs: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def extras_for(self, hosts: Sequence[str]) -> list[str]:
        """The extras that `hosts` (one, or the hosts of one shared workdir) must hold."""
        every = {f.sha256 for f in self.extras}
        wanted = set().union(*(self.needs.get(h, every) for h in hosts)) if hosts else every
        return sorted(wanted & every)

    def entries(self) -> list[list[Any]]:
        """The code's files as a materialize names them: [relpath, sha256, mode]."""
        return [[f.path, f.sha256, f.mode] for f in self.files]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def extras_bytes(self) -> int:
        """The wheels' and image layers' bytes: most of a cold environment's push."""
        return sum(f.size for f in self.extras)

    def sending_note(self) -> str:
        """The push's note: what the contents weigh, the wheels and layers included (each
        host is sent only what its store lacks: the progress counts that)."""
        said = f"the code: {human_size(self.total_bytes)}"
        if self.extras:
            said += f", the wheels and image layers: {human_size(self.extras_bytes)}"
        return said + "; only what a host lacks travels"

    def by_hash(self) -> dict[str, CodeFile]:
        return {f.sha256: f for f in (*self.files, *self.extras)}


@dataclass(frozen=True)
class HostRecord:
    """The run as each host records it in its run directory (run.json), sent with every
    materialize: what `status`, `down` and the lease read there later."""

    run_id: str
    job: str
    lease_seconds: float
    controller: str  # who started the run (user@machine)
    # The run's own list of its hosts, (name, address): `down`/`status` from a shell whose
    # inventory dropped one can still name it (results/runs.py).
    hosts: tuple[tuple[str, str], ...]
    hosts_at: float  # Unix seconds: when that list was made
    # A detached run too starts undetached: the lease holds until every task started and `up`
    # returns (detach()), so an `up --detach` killed half-way leaves nothing running.
    detached: bool = False

    def materialize(
        self, manifest: Manifest, host: str, *, or_missing: bool = False
    ) -> protocol.MaterializeRequest:
        """`host`'s materialize: the code's files, and `keep`, the extras its store must hold
        too (a host lacking one answers it missing, and gets it). `or_missing`: a host that
        lacks contents says which instead of failing."""
        request: protocol.MaterializeRequest = {
            "run_id": self.run_id,
            "job": self.job,
            "files": manifest.entries(),
            "detached": self.detached,
            "lease_seconds": self.lease_seconds,
            "controller": self.controller,
            "hosts": [[name, address] for name, address in self.hosts],
            "hosts_at": self.hosts_at,
        }
        keep = manifest.extras_for([host])
        if keep:
            request["keep"] = keep
        if or_missing:
            request["or_missing"] = True
        return request


@dataclass(frozen=True)
class PushResult:
    files: int  # files in the run's code directory
    sent_files: int
    sent_bytes: int


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(ALWAYS_IGNORED)
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def scan(root: Path) -> Manifest:
    """Lists and hashes the code directory, honouring .gitignore and .tfdeployignore at its top;
    a file unchanged since an earlier scan keeps its hash without being read (push/hashcache)."""
    spec = _ignore_spec(root)
    cache = HashCache(root)
    private = _state_inside(root)
    files: list[CodeFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if prefix + d + "/" != private and not spec.match_file(prefix + d + "/")
        )
        for name in sorted(filenames):
            rel = prefix + name
            full = Path(dirpath) / name
            if spec.match_file(rel) or not full.is_file():
                continue
            try:
                files.append(_hashed(full, rel, cache))
            except OSError as exc:
                raise InventoryError(str(root), "job.code", f"cannot read {rel}: {exc}") from None
    cache.save()
    return Manifest(root=root, files=tuple(files))


def _state_inside(root: Path) -> str | None:
    """This controller's state folder as a path relative to the code directory ("x/y/"), when
    it lies inside it (a code directory that is the home folder; a test's tmp dir): run records
    and the hash cache are not code, and the cache, written at the end of each scan, would
    read as a file that changed while it was pushed."""
    try:
        inside = state_dir().resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return None
    return inside + "/" if inside != "." else None


def _hashed(full: Path, rel: str, cache: HashCache) -> CodeFile:
    opened_at = time.time()
    with full.open("rb") as f:  # stamps read through the open file: NFS revalidates them
        st = os.fstat(f.fileno())
        stamp, mode = stamp_of(st), st.st_mode & 0o777
        known = cache.lookup(rel, stamp)
        if known is not None:
            return CodeFile(path=rel, sha256=known, mode=mode, size=st.st_size)
        digest = hashlib.file_digest(f, "sha256").hexdigest()  # in pieces: bounded memory
        size = f.tell()
    if size == st.st_size:  # else it grew or shrank while being read: hashed again next time
        cache.remember(rel, stamp, digest, opened_at)
    return CodeFile(path=rel, sha256=digest, mode=mode, size=size)


class ByteMeter:
    """Bytes sent to each host while a push runs, and how many it lacks: what the progress of
    `up`'s push shows (sending: MB of MB per host, rate, ETA). Written by the pushing threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.lacking: dict[str, int] = {}

    def expect(self, host: str, count: int) -> None:
        with self._lock:
            self.lacking[host] = self.lacking.get(host, 0) + count
            self.sent.setdefault(host, 0)

    def add(self, host: str, count: int) -> None:
        with self._lock:
            self.sent[host] = self.sent.get(host, 0) + count

    def snapshot(self) -> list[tuple[str, int, int]]:
        """(host, bytes sent, bytes it lacked) per host with something to send."""
        with self._lock:
            return [(h, self.sent.get(h, 0), n) for h, n in sorted(self.lacking.items())]


def push(
    agent: Agent,
    manifest: Manifest,
    record: HostRecord,
    lacking: Sequence[str] | None = None,
    meter: ByteMeter | None = None,
) -> PushResult:
    """Sends the contents the host lacks, then has the agent build the run directory.

    `materialize` first (unless `lacking` is the host's answer, asked just before): a host that
    has every content builds the run directory at once, one call in all (a re-deploy of
    unchanged code); one that lacks some says which, and gets them in a second `materialize`,
    streamed raw after its request line on a session of their own, read from disk piece by
    piece: memory stays bounded whatever the files' sizes, and polls of other runs are not held
    up.
    """
    by_hash = manifest.by_hash()
    count = len(manifest.files)
    if lacking is None:
        lacking = materialize_or_missing(agent, manifest, record)
        if not lacking:
            return PushResult(files=count, sent_files=0, sent_bytes=0)
    missing = [by_hash[sha] for sha in lacking]
    request = record.materialize(manifest, agent.host)
    if missing:
        on_piece = None
        if meter is not None:
            meter.expect(agent.host, sum(f.size for f in missing))
            on_piece = functools.partial(meter.add, agent.host)
        with agent.dedicated() as own:
            _materialize(own, manifest, missing, request, on_piece)
    else:
        agent.ask(ops.MATERIALIZE, request)
    sent = sum(f.size for f in missing)
    return PushResult(files=count, sent_files=len(missing), sent_bytes=sent)


def materialize_or_missing(agent: Agent, manifest: Manifest, record: HostRecord) -> list[str]:
    """Builds the run directory if the host's store has every content ([]: done); else the
    hashes it lacks (what `have` answers), and nothing is built."""
    request = record.materialize(manifest, agent.host, or_missing=True)
    reply = agent.ask(ops.MATERIALIZE, request)
    return reply.get("missing", [])  # absent: the run directory was built


def send_contents(
    agent: Agent,
    manifest: Manifest,
    contents: Sequence[CodeFile],
    op: str,
    *,
    wait: float = 0,
    on_piece: Callable[[int], None] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """One `op` request with `contents` streamed raw after its line (its `blobs`), read from disk
    piece by piece; the reply. `wait`: seconds the host may spend beyond the transfer itself;
    `on_piece`: told each piece's size as it is handed to the connection."""
    try:
        return agent.call(
            op,
            timeout=_timeout(contents) + wait,
            blobs=[[f.sha256, f.size] for f in contents],
            body=_contents(manifest.root, contents, on_piece),
            **params,
        )
    except HostError as exc:
        changed = _changed(manifest.root, contents, exc)
        if changed is None:
            raise
        raise changed from None


def _materialize(
    agent: Agent,
    manifest: Manifest,
    contents: Sequence[CodeFile],
    request: protocol.MaterializeRequest,
    on_piece: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    return send_contents(
        agent, manifest, contents, protocol.OP_MATERIALIZE, on_piece=on_piece, **request
    )


def _contents(
    root: Path, contents: Sequence[CodeFile], on_piece: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """Each file's bytes in READ_BYTES pieces. The host hashes what arrives and refuses a
    content whose hash is not the manifest's, so this side reads each byte once, hashes nothing
    and only checks the sizes."""
    for code_file in contents:
        left = code_file.size
        with (root / code_file.path).open("rb") as f:
            while left:
                piece = f.read(min(READ_BYTES, left))
                if not piece:
                    break
                left -= len(piece)
                yield piece
                if on_piece is not None:
                    on_piece(len(piece))
            if left or f.read(1):
                raise _changed_error(root, code_file)


def _changed(root: Path, contents: Sequence[CodeFile], exc: HostError) -> TfdeployError | None:
    """The host's "content arrived damaged" (protocol.FAIL_DAMAGED) about a file of ours: it
    changed on disk between hashing and sending, and saying which file is the useful error."""
    if exc.code != protocol.FAIL_DAMAGED:
        return None
    for code_file in contents:
        if code_file.sha256 == exc.subject:
            return _changed_error(root, code_file)
    return None


def _changed_error(root: Path, code_file: CodeFile) -> TfdeployError:
    if Path(code_file.path).is_absolute():  # not the code's: a cached wheel or image blob
        return damaged(Path(code_file.path))
    return InventoryError(
        str(root),
        "job.code",
        f"{code_file.path} changed while tfdeploy was pushing it",
        hint="something writes into the code directory: move that output elsewhere or "
        "list it in .tfdeployignore, then run up again",
    )


def push_all(
    fleet: Fleet,
    members: Sequence[Member],
    manifest: Manifest,
    record: HostRecord,
    groups: Sequence[Sequence[str]] = (),
    known: Mapping[str, Sequence[str]] | None = None,
    meter: ByteMeter | None = None,
) -> dict[str, PushResult]:
    """Pushes to `members`; hosts sharing a workdir (`groups`) get each content once. `known`:
    what some hosts lack, as they answered just before or as their hello said (an empty
    store): they are not asked again.

    The first host of each group pushes in the first wave, the rest of the group in a second
    wave and find in the shared store what their first host just put there.
    """
    later = {h for g in groups for h in g[1:]}
    results: dict[str, PushResult] = {}
    for wave in (
        [m for m in members if m.name not in later],
        [m for m in members if m.name in later],
    ):
        results |= fleet.each(
            lambda m: push(m.agent, manifest, record, (known or {}).get(m.name), meter),
            wave,
            what="pushing the code failed",
        )
    return results


def run_setup(
    member: Member,
    run_id: str,
    job: Job,
    manifest: Manifest,
    where: Mapping[str, str] | None = None,
) -> bool:
    """job.setup on one host; False when an identical setup already ran there (its marker).
    `where`: the venv (or python) it runs in; another one is another setup."""
    inside = {f"tfdeploy:{k}": v for k, v in (where or {}).items()}
    fingerprint = setup_fingerprint(job.setup, job.env | inside, manifest)
    result = member.agent.setup(run_id, job.setup, job.env, fingerprint, where=where)
    if result.code:
        tail = "\n    ".join(result.tail)
        message = f"setup failed (exit code {result.code}):\n    {tail}"
        raise HostError(member.name, mask_text(message, job.env, job.secret_env))
    return result.ran


READ_BYTES = 1 << 20  # a pushed file is read and sent in pieces of this size
MIN_RATE = 256 * 1024  # bytes/s per host below which a push counts as stuck


def _timeout(contents: Sequence[CodeFile]) -> float:
    """The hosts share the controller's bandwidth: 32 hosts taking 32 MiB each need far longer
    than the 60 s a small call gets."""
    return 60 + sum(f.size for f in contents) / MIN_RATE


def setup_fingerprint(commands: tuple[str, ...], env: dict[str, str], manifest: Manifest) -> str:
    """Identifies a setup: its commands, env and the code files they name (requirements.txt...).

    Hashing only the named files keeps an unrelated code edit from re-running a slow pip install.
    """
    named = set()
    for command in commands:
        try:
            named.update(shlex.split(command))
        except ValueError:
            named.update(command.split())
    digest = hashlib.sha256()
    for part in (*commands, *sorted(f"{k}={v}" for k, v in env.items())):
        digest.update(part.encode() + b"\0")
    for f in manifest.files:
        if f.path in named or f.path.lstrip("./") in named:
            digest.update(f"{f.path}={f.sha256}\0".encode())
    return digest.hexdigest()[:16]
