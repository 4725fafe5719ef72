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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec

from deployer.config.model import Job
from deployer.core.errors import HostError, InventoryError
from deployer.core.secrets import mask_text
from deployer.hosts.agent import Agent
from deployer.hosts.fleet import Fleet, Member
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
    root: Path
    files: tuple[CodeFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_hash(self) -> dict[str, CodeFile]:
        return {f.sha256: f for f in self.files}


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
    """Lists and hashes the code directory, honouring .gitignore and .tfdeployignore at its top."""
    spec = _ignore_spec(root)
    files: list[CodeFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not spec.match_file(prefix + d + "/"))
        for name in sorted(filenames):
            rel = prefix + name
            full = Path(dirpath) / name
            if spec.match_file(rel) or not full.is_file():
                continue
            try:
                data = full.read_bytes()
            except OSError as exc:
                raise InventoryError(str(root), "job.code", f"cannot read {rel}: {exc}") from None
            files.append(
                CodeFile(
                    path=rel,
                    sha256=hashlib.sha256(data).hexdigest(),
                    mode=full.stat().st_mode & 0o777,
                    size=len(data),
                )
            )
    return Manifest(root=root, files=tuple(files))


def push(agent: Agent, manifest: Manifest, run_fields: dict[str, Any]) -> PushResult:
    """Sends the contents the host lacks, then has the agent build the run directory.

    Two agent calls per host: `have`, then `materialize` with the missing contents streamed
    after its request line (batches of at most BATCH_BYTES, so memory stays bounded).
    """
    by_hash = manifest.by_hash()
    missing = agent.missing(sorted(by_hash))
    batches = _batches([by_hash[sha] for sha in missing])
    files = [[f.path, f.sha256, f.mode] for f in manifest.files]
    for batch in batches[:-1]:  # only above BATCH_BYTES: store these, build the run dir last
        _store_batch(agent, manifest, batch, run_fields)
    last = batches[-1] if batches else ()
    agent.call(
        protocol.OP_MATERIALIZE,
        timeout=_timeout(last),
        files=files,
        stream=_pack(manifest.root, last),
        **_blob_list(last),
        **run_fields,
    )
    sent = sum(by_hash[sha].size for sha in missing)
    return PushResult(files=len(files), sent_files=len(missing), sent_bytes=sent)


def store_contents(
    agent: Agent, manifest: Manifest, contents: Sequence[CodeFile], run_fields: dict[str, Any]
) -> None:
    """Streams `contents` into the host's store, in batches; the run's code dir comes later."""
    for batch in _batches(list(contents)):
        _store_batch(agent, manifest, batch, run_fields)


def _store_batch(
    agent: Agent, manifest: Manifest, batch: tuple[CodeFile, ...], run_fields: dict[str, Any]
) -> None:
    agent.call(
        protocol.OP_MATERIALIZE,
        timeout=_timeout(batch),
        files=[],
        stream=_pack(manifest.root, batch),
        **_blob_list(batch),
        **run_fields,
    )


def push_all(
    fleet: Fleet,
    members: Sequence[Member],
    manifest: Manifest,
    run_fields: dict[str, Any],
    groups: Sequence[Sequence[str]] = (),
) -> dict[str, PushResult]:
    """Pushes to `members`; hosts sharing a workdir (`groups`) get each content once.

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
            lambda m: push(m.agent, manifest, run_fields), wave, what="pushing the code failed"
        )
    return results


def run_setup(member: Member, run_id: str, job: Job, manifest: Manifest) -> bool:
    """job.setup on one host; False when an identical setup already ran there (its marker)."""
    fingerprint = setup_fingerprint(job.setup, job.env, manifest)
    result = member.agent.setup(run_id, job.setup, job.env, fingerprint)
    if result.code:
        tail = "\n    ".join(result.tail)
        message = f"setup failed (exit code {result.code}):\n    {tail}"
        raise HostError(member.name, mask_text(message, job.env, job.secret_env))
    return result.ran


BATCH_BYTES = 32 * 1024 * 1024
MIN_RATE = 256 * 1024  # bytes/s per host below which a push counts as stuck


def _timeout(batch: tuple[CodeFile, ...]) -> float:
    """The hosts share the controller's bandwidth (~50-100 MB/s of SSH on 2 cores): 32 hosts
    taking 32 MiB each need far longer than the 60 s a small call gets."""
    return 60 + sum(f.size for f in batch) / MIN_RATE


def _batches(files: list[CodeFile]) -> list[tuple[CodeFile, ...]]:
    batches: list[tuple[CodeFile, ...]] = []
    current: list[CodeFile] = []
    size = 0
    for f in files:
        if current and size + f.size > BATCH_BYTES:
            batches.append(tuple(current))
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        batches.append(tuple(current))
    return batches


def _blob_list(batch: tuple[CodeFile, ...]) -> dict[str, Any]:
    return {"blobs": [[f.sha256, f.size] for f in batch]} if batch else {}


_pack_lock = threading.Lock()


@functools.lru_cache(maxsize=2)
def _pack_cached(root: Path, batch: tuple[CodeFile, ...]) -> bytes:
    return b"".join(_read_unchanged(root, f) for f in batch)


def _read_unchanged(root: Path, code_file: CodeFile) -> bytes:
    """The file's bytes, provided they are still those the manifest hashed.

    Otherwise hosts would store (or refuse) content under a hash it does not have; saying which
    file changed is the useful error.
    """
    data = (root / code_file.path).read_bytes()
    if len(data) != code_file.size or hashlib.sha256(data).hexdigest() != code_file.sha256:
        raise InventoryError(
            str(root),
            "job.code",
            f"{code_file.path} changed while tfdeploy was pushing it",
            hint="something writes into the code directory: move that output elsewhere or "
            "list it in .tfdeployignore, then run up again",
        )
    return data


def _pack(root: Path, batch: tuple[CodeFile, ...]) -> bytes:
    """The contents of a batch, concatenated; hosts missing the same files share one copy."""
    with _pack_lock:  # one read of the files even when 32 hosts ask at once
        return _pack_cached(root, batch)


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
