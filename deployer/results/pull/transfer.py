"""The bulk fetch of a pull: every content from one host, hashed as it comes, into its part file."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from deployer.core.errors import (
    HostError,
    HostsFailed,
    LocalError,
)
from deployer.hosts.agent import Agent
from deployer.hosts.fetching import FetchOrder
from deployer.hosts.fleet import Fleet, Member, Pending
from deployer.hosts.reply_types import RemoteFile
from deployer.results.pull.localdisk import inside_run, writing
from deployer.results.pull.parts import (
    Cancelled,
    Changed,
    Landing,
    adopt_part,
    let_go,
    open_part,
    refusal,
)
from deployer.results.pull.plan import Wanted, already_has, content_key
from deployer.results.pull.replicas import arrived

STOP_WAIT_S = 3.0  # after Ctrl-C, how long the transfers get to stop before `pull` returns


class Fetch:
    """Each missing content once, hosts in parallel, each on a session of its own; Ctrl-C (or
    a local error) stops every transfer at once, keeping what arrived."""

    def __init__(self, run_id: str, patterns: Sequence[str], parts: Path) -> None:
        self.run_id = run_id
        self.patterns = patterns
        self.parts = parts
        self.cancelled = threading.Event()
        self.sent = 0  # bytes that travelled
        self.fetched = 0  # contents this pull fetched (not those another pull brought meanwhile)
        self.landed: dict[Path, str] = {}  # where each fetched content is, and its sha256
        self.refused: list[str] = []  # files that changed while they were sent (refusal)
        self.not_kept: set[Path] = set()  # and where they would have landed
        self.local: list[LocalError] = []
        self._lock = threading.Lock()
        self._open: list[Agent] = []  # the sessions carrying bytes now

    def all(self, fleet: Fleet, sources: dict[str, Wanted]) -> int:
        """Fetches `sources`; returns how many bytes travelled (a resumed content counts only
        its rest); `fetched` counts the contents."""
        with writing(self.parts):
            self.parts.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.parts, 0o700)  # contents may be private: only their owner looks in
        by_host: dict[str, list[tuple[str, RemoteFile, Path]]] = {}
        for member, name, remote, dest in sources.values():
            by_host.setdefault(member.name, []).append((name, remote, dest))
        pendings = [
            fleet.submit(functools.partial(self._host, items=items), fleet.member(host))
            for host, items in by_host.items()
        ]
        try:
            for pending in pendings:
                pending.wait()
        except KeyboardInterrupt:
            self._stop(pendings)  # a second Ctrl-C here ends the wait at once
            raise
        return self._outcome(pendings)

    def _outcome(self, pendings: list[Pending[None]]) -> int:
        if self.local:  # this machine's problem, whatever the hosts did meanwhile
            raise self.local[0]
        failures = []
        for pending in pendings:
            try:
                pending.result()
            except HostError as exc:
                failures.append(exc)
        if failures:
            raise HostsFailed(failures, what="pulling files failed", outcome=None)
        return self.sent

    def _stop(self, pendings: list[Pending[None]]) -> None:
        """No byte written from now on; the sessions closed (which ends the hosts' sends), and
        the transfers given STOP_WAIT_S to notice."""
        self.cancelled.set()
        with self._lock:
            sessions = list(self._open)
        for agent in sessions:  # closing a local session waits for its process: not here
            threading.Thread(target=agent.close_session, daemon=True).start()
        deadline = time.monotonic() + STOP_WAIT_S
        for pending in pendings:
            pending.wait(max(0.0, deadline - time.monotonic()))

    def _host(self, member: Member, items: list[tuple[str, RemoteFile, Path]]) -> None:
        landings: collections.deque[Landing] = collections.deque()  # requested, not yet done
        try:
            with member.agent.dedicated() as agent:  # bulk bytes: a session of their own
                with self._lock:
                    if self.cancelled.is_set():
                        return
                    self._open.append(agent)
                orders = self._orders(items, landings)
                fetches = agent.fetch_each(self.run_id, self.patterns, orders)
                with contextlib.closing(fetches):  # an error here ends the session at once
                    for _, got in fetches:
                        landing = landings.popleft()
                        try:
                            fetched = landing.finish(member.name, got)
                        except Changed:  # that file only: the host's next ones still come
                            why = refusal(member.name, landing.name, landing.remote.path)
                            with self._lock:
                                self.refused.append(why)
                                self.not_kept.add(landing.dest)
                            continue
                        with self._lock:
                            self.sent += fetched
                            self.fetched += 1
                            self.landed[landing.dest] = landing.sha256
        except Cancelled:
            return
        except LocalError as exc:  # a full disk fails every host's transfers: stop them all
            with self._lock:
                self.local.append(exc)
            self.cancelled.set()
        finally:
            for landing in landings:  # requested, never fetched: their parts stay to resume
                let_go(landing)

    def _orders(
        self, items: list[tuple[str, RemoteFile, Path]], landings: collections.deque[Landing]
    ) -> Iterator[FetchOrder]:
        """Each content's fetch, its part file resumed and locked just before it is requested
        (a content another pull put in place meanwhile is skipped).

        A host's fetches hold several part locks at once (those requested ahead), so every pull
        takes them in one order, by content: two pulls into one folder wait for each other's
        parts, never in a circle."""
        for name, remote, dest in sorted(items, key=lambda i: content_key(i[1], i[2])):
            if self.cancelled.is_set():
                raise Cancelled
            landing = self._landing(name, remote, dest)
            if landing is None:
                continue
            landings.append(landing)
            listed = remote.size
            yield FetchOrder(name, remote.path, landing.offset, landing.sink, listed_size=listed)

    def _landing(self, name: str, remote: RemoteFile, dest: Path) -> Landing | None:
        """The content's part file, open, locked and ready to append to; None when another
        pull brought the content meanwhile."""
        inside_run(dest, self.parts.parent)
        with writing(dest.parent):
            dest.parent.mkdir(parents=True, exist_ok=True)
        part = self.parts / f"{content_key(remote, dest)}.part"
        adopt_part(part, self.parts / f"{content_key(replace(remote, sha256=None), dest)}.part")
        if remote.sha256 is not None and already_has(dest, remote.sha256):  # a first pull beside us
            return None
        while True:
            out = open_part(part, self.parts)
            if out is not None:
                break
            if arrived(dest, remote.sha256):  # the pull we waited for brought it
                return None
        return Landing(out, part, name, remote, dest, self.cancelled, self.parts.parent)
