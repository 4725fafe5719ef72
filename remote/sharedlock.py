"""A lock that holds on every file system a workdir lives on: local disks, NFS and EFS homes.

Why a directory and not fcntl/flock: POSIX locks on NFSv3 need the lockd/statd side services
(often firewalled or not running on the file server), flock() on Linux NFS is emulated with
them, and some EFS mounts answer lock calls with ENOLCK; a lock that silently does not hold would
let two hosts of one shared home build the same environment into the same directory. An atomic
`mkdir` is one request the file server decides alone (it fails with EEXIST for all but one
caller), on every file system.

A directory lock outlives a killed holder, so the holder leaves an `owner` file (host identity,
pid, process start ticks, a random token) and touches a `heartbeat` file inside while it holds
the lock. A waiter takes the lock over when
- the holder is on the waiter's own host and its process is gone (a SIGKILLed build: at once), or
- the heartbeat's mtime has not changed for STALE_S seconds as the waiter watches it.
The second rule never compares one host's clock with another's (hosts sharing a home may
disagree by minutes): only whether the value moves, timed by the waiter's monotonic clock.
A takeover renames the stale directory to a name of its own before removing it, so of two
waiters taking over at once only one succeeds; the other simply waits on the new holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HEARTBEAT_S = 2.0  # how often the holder touches its heartbeat
STALE_S = 30.0  # a heartbeat that has not moved this long belongs to a dead or frozen holder
POLL_S = 0.2


class LockLost(Exception):
    """The lock was taken over while it was held (the holder was frozen past STALE_S)."""


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: tells a live process from a recycled pid."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return int(data[data.rfind(b")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _touch(path: Path) -> None:
    """This host's clock, not the file server's (an utime(None) on NFS takes the server's)."""
    os.close(os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600))
    now = time.time()
    os.utime(str(path), (now, now))


class SharedLock:
    """`with SharedLock(path, host_id).held(): ...`; `path` must not exist except as a lock."""

    def __init__(self, path: Path, host_id: str, *, stale_s: float = STALE_S) -> None:
        self.path = path
        self.host_id = host_id
        self.stale_s = stale_s
        self.token = os.urandom(8).hex()
        self._stop = threading.Event()

    @contextlib.contextmanager
    def held(self, on_wait: Callable[[dict[str, Any]], None] | None = None) -> Iterator[None]:
        """Waits for the lock (telling `on_wait` once who holds it), holds it, releases it."""
        self._acquire(on_wait)
        beat = threading.Thread(target=self._beat, name="lock-heartbeat", daemon=True)
        beat.start()
        try:
            yield
        finally:
            self._stop.set()
            beat.join()
            self._release()

    def still_mine(self) -> bool:
        """True while the lock directory is still the one this holder made."""
        owner = _read_owner(self.path)
        return owner is not None and owner.get("token") == self.token

    def check(self) -> None:
        if not self.still_mine():
            raise LockLost(f"the lock {self.path} was taken over by another builder")

    def _acquire(self, on_wait: Callable[[dict[str, Any]], None] | None) -> None:
        told = False
        seen: tuple[Any, float] | None = None  # (heartbeat mtime, when it last moved)
        while True:
            try:
                os.mkdir(str(self.path), 0o700)
            except FileExistsError:
                pass
            else:
                self._write_owner()
                return
            owner = _read_owner(self.path) or {}
            if on_wait is not None and not told:
                on_wait(owner)
                told = True
            beat = _mtime(self.path / "heartbeat")
            now = time.monotonic()
            if seen is None or seen[0] != beat:
                seen = (beat, now)
            if self._dead(owner) or now - seen[1] >= self.stale_s:
                self._take_over()
                seen = None
                continue
            time.sleep(POLL_S)

    def _dead(self, owner: dict[str, Any]) -> bool:
        """The holder ran on this host and its process is gone (or the pid was recycled)."""
        if owner.get("host") != self.host_id or not isinstance(owner.get("pid"), int):
            return False
        return _start_ticks(owner["pid"]) != owner.get("ticks")

    def _take_over(self) -> None:
        grave = self.path.with_name(f"{self.path.name}.stale-{self.token}")
        try:
            os.rename(str(self.path), str(grave))
        except FileNotFoundError:
            return  # another waiter took it over first, or the holder released it
        shutil.rmtree(str(grave), ignore_errors=True)

    def _write_owner(self) -> None:
        pid = os.getpid()
        owner = {"host": self.host_id, "pid": pid, "ticks": _start_ticks(pid)}
        owner.update({"token": self.token, "since": time.time()})
        _touch(self.path / "heartbeat")
        tmp = self.path / f".owner.{self.token}"
        tmp.write_text(json.dumps(owner))
        os.replace(str(tmp), str(self.path / "owner"))

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if not self.still_mine():
                return  # taken over: touching the new holder's heartbeat would hide its death
            with contextlib.suppress(OSError):
                _touch(self.path / "heartbeat")

    def _release(self) -> None:
        if self.still_mine():
            grave = self.path.with_name(f"{self.path.name}.done-{self.token}")
            with contextlib.suppress(OSError):
                os.rename(str(self.path), str(grave))
                shutil.rmtree(str(grave), ignore_errors=True)


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / "owner").read_text())
    except (OSError, ValueError):
        return None  # not written yet (the holder is between mkdir and its owner file)
    return data if isinstance(data, dict) else None


def _mtime(path: Path) -> Any:
    try:
        return os.stat(str(path)).st_mtime_ns
    except OSError:
        return None
