"""Per-host progress while the job's environment installs: wheels installed of total, elapsed.

The env op that builds a venv answers only when it is done (a TensorFlow set with pip: a minute
per host, with CUDA wheels several). Meanwhile this asks each host still building, every
EVERY_S seconds, how many of its environment's projects are ready (the `envprogress` op: their
.dist-info in the venv, which pip writes as each project lands, or their unpacked files in the
host's uv cache, where uv spends its time before it links them all at once), on a one-shot
call beside the busy session, and hands each answer to a callback as an `InstallProgress`: `up`
prints it as a plain line per host (`installing on h1: 12 of 38 wheels, 8 s`), and a live view
may draw it instead. A host whose env is complete (reused, or built) is not reported. Progress is
best-effort: a host that cannot answer is skipped, never failed (the env op says what failed).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deployer.hosts.fleet import Member

EVERY_S = 3.0


@dataclass(frozen=True)
class InstallProgress:
    """One host's environment build, as far as it got."""

    host: str
    installed: int  # wheels (projects) in the venv now
    total: int  # wheels the environment installs
    elapsed: float  # seconds since the install phase began

    def line(self) -> str:
        return (
            f"installing on {self.host}: {self.installed} of {self.total} wheels, "
            f"{self.elapsed:.0f} s"
        )


OnProgress = Callable[[InstallProgress], None]


def project(wheel_file: str) -> str:
    """A wheel's project name as the host compares it (remote/envop.py normalized)."""
    return re.sub(r"[-_.]+", "_", wheel_file.split("-", 1)[0]).lower()


class Watch:
    """Asks the building hosts how far they are until stopped; `done(host)` as each answers."""

    def __init__(
        self,
        members: Sequence[Member],
        builds: Mapping[str, Sequence[tuple[str, Sequence[str]]]],
        on_progress: OnProgress,
        every: float = EVERY_S,
    ) -> None:
        """`builds`: host -> [(env hash, its projects' names)]."""
        self.members = {m.name: m for m in members if builds.get(m.name)}
        self.builds, self.on_progress, self.every = builds, on_progress, every
        self.finished: set[str] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="env-progress", daemon=True)

    def __enter__(self) -> Watch:
        if self.members:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.every + 20)

    def done(self, host: str) -> None:
        with self.lock:
            self.finished.add(host)

    def _loop(self) -> None:
        while not self.stopping.wait(self.every):
            for name, member in self.members.items():
                with self.lock:
                    if name in self.finished:
                        continue
                if self.stopping.is_set():
                    return
                self._ask(name, member)

    def _ask(self, name: str, member: Member) -> None:
        installed = total = 0
        complete = True
        try:
            for env_hash, names in self.builds[name]:
                reply = member.agent.env_progress(env_hash, names)
                installed += reply["installed"]
                total += len(names)
                complete &= reply["complete"]
        except Exception:  # best-effort: the env op itself says what failed
            return
        if complete:
            return  # reused, or built and being checked: nothing is installing
        with self.lock:
            if name in self.finished:
                return
        self.on_progress(InstallProgress(name, installed, total, time.monotonic() - self.started))
