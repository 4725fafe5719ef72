"""Control-side client of the remote agent: one typed method per op of docs/PROTOCOL.md, each
building its request as the op's shape (remote/protocol.py) and reading a reply checked against
its shape at the edge (Channel.ask, deployer/hosts/replies.py).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

from deployer.hosts import ops
from deployer.hosts.channel import Channel
from deployer.hosts.fetching import FETCH_AHEAD, Fetched, FetchOrder, FetchReading
from deployer.hosts.replies import Edge, metric_records, text
from deployer.hosts.reply_types import (
    Collected,
    Escaped,
    Poll,
    SetupResult,
    StopReport,
    TaskStatus,
)
from deployer.hosts.transport import SessionEnded
from remote import protocol


class Agent(Channel):
    """The agent on one host, reached through that host's transport: its ops, typed."""

    def missing(self, hashes: Sequence[str]) -> list[str]:
        request: protocol.HaveRequest = {"hashes": list(hashes)}
        return self.ask(ops.HAVE, request)["missing"]

    def start(
        self,
        run_id: str,
        tasks: list[protocol.StartTask],
        grace: float,
        *,
        release: bool = False,
        resumed: bool = False,
    ) -> list[TaskStatus]:
        """`release`: then drop the run's port reservations here (as `release` would).
        `resumed` (`up --resume`): each task's log says where its new attempt begins."""
        request: protocol.StartRequest = {"run_id": run_id, "tasks": tasks, "grace": grace}
        if release:
            request["release"] = True
        if resumed:
            request["resumed"] = True
        reply = self.ask(ops.START, request)
        edge = Edge(self.host, protocol.OP_START)
        named = {t["name"] for t in tasks}
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
        metrics: dict[str, int] | None = None,
    ) -> Poll:
        """`metrics`: task -> offset in its metrics file; the reply brings the lines after it."""
        raw: list[bytes] = []  # every task's new bytes, in the order `logs` lists them
        reply = self._poll(
            run_id, offsets, max_bytes, raw.append, ports, heartbeat, timeout, metrics
        )
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
            metrics=_metric_lines(reply.get("metrics") or [], edge, metrics or {}),
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
        metrics: dict[str, int] | None = None,
    ) -> protocol.PollReply:
        request: protocol.PollRequest = {
            "run_id": run_id,
            "offsets": offsets,
            "max_bytes": max_bytes,
            "ports": list(ports),
            "heartbeat": heartbeat,
        }
        if metrics is not None:
            request["metrics"] = metrics
        return self.ask(ops.POLL, request, timeout, sink=sink)

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
        reply = self.ask(ops.STOP, request, 2 * grace + 60)
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
        self.ask(ops.IDLE, request)

    def detach(self, run_id: str) -> None:
        """Drops the run's lease: it outlives the controller from now on (`up --detach`)."""
        request: protocol.RunRequest = {"run_id": run_id}
        self.ask(ops.DETACH, request)

    def keep_warden(self, run_id: str, secret: str, address: str, idle_seconds: float) -> int:
        """Starts this host's warden of the run on its cluster address; returns its port."""
        request: protocol.KeepRequest = {
            "action": protocol.KEEP_WARDEN,
            "run_id": run_id,
            "secret": secret,
            "address": address,
            "idle_seconds": idle_seconds,
        }
        reply = self.ask(ops.KEEP_WARDEN, request)
        edge = Edge(self.host, protocol.OP_KEEP)
        port = edge.count(reply["port"], "the warden's port")
        if not 0 < port < 65536:
            raise edge.error("port", f"{port} is no TCP port")
        return port

    def keep(self, run_id: str, secret: str, plan: dict[str, Any]) -> None:
        """Starts the run's keeper on this host: from now on it holds the run's policy."""
        request: protocol.KeepRequest = {
            "action": protocol.KEEP_KEEPER,
            "run_id": run_id,
            "secret": secret,
            "plan": plan,
        }
        self.ask(ops.KEEP_KEEPER, request)

    def release(self, run_id: str) -> None:
        """Drops the run's port reservations (preflight failed: nothing of it will start)."""
        request: protocol.RunRequest = {"run_id": run_id}
        self.ask(ops.RELEASE, request)

    def setup(
        self,
        run_id: str,
        commands: Sequence[str],
        env: Mapping[str, str],
        fingerprint: str,
        timeout: float = 3600,
        where: Mapping[str, str] | None = None,
    ) -> SetupResult:
        """`where`: {"venv": path} or {"python": path}, what the commands run in."""
        request: protocol.SetupRequest = {
            "run_id": run_id,
            "commands": list(commands),
            "env": dict(env),
            "fingerprint": fingerprint,
        }
        request.update(where or {})  # type: ignore[typeddict-item]
        reply = self.ask(ops.SETUP, request, timeout)
        return SetupResult(
            code=reply["code"], ran=reply["ran"], tail=tuple(text(line) for line in reply["tail"])
        )

    def env(self, request: protocol.EnvRequest, timeout: float) -> protocol.EnvReply:
        """The job's venv built (or reused) here from wheels in the store. Its texts are
        printed (versions, paths): parsed and cleaned at the edge like the hello's."""
        return self.ask(ops.ENVIRONMENT, request, timeout)

    def env_progress(self, env_hash: str, names: Sequence[str]) -> protocol.EnvProgressReply:
        """How many of `names` (normalized project names) the env being built holds now; asked
        beside the env op that builds it (a one-shot call: its session is busy)."""
        request: protocol.EnvProgressRequest = {"hash": env_hash, "names": list(names)}
        reply = self.ask(ops.ENV_PROGRESS, request, 15)
        if not 0 <= reply["installed"] <= len(names):
            raise Edge(self.host, protocol.OP_ENV_PROGRESS).error(
                "installed", f"is {reply['installed']}, not 0 to {len(names)}"
            )
        return reply

    def image(self, request: protocol.ImageRequest, timeout: float) -> protocol.ImageReply:
        """The job's image checked (pulled if asked) or loaded here; its texts are printed
        (runtime, platforms): cleaned at the edge like the hello's."""
        return self.ask(ops.IMAGE, request, timeout)

    def profile(
        self,
        run_id: str,
        stamp: str,
        *,
        seconds: float,
        start_in: float,
        tasks: Sequence[str] | None = None,
    ) -> list[protocol.ProfiledShape]:
        """TensorFlow traces of the run's tasks here (remote/profiling.py), each into its task's
        profile/<stamp>/, all starting `start_in` seconds after the host reads the request: each
        task traced, or why not (the host's words, cleaned at the edge)."""
        request: protocol.ProfileRequest = {
            "run_id": run_id,
            "stamp": stamp,
            "seconds": seconds,
            "start_in": start_in,
        }
        if tasks is not None:
            request["tasks"] = list(tasks)
        budget = start_in + seconds + protocol.PROFILE_WRITE_SECONDS + 30
        return list(self.ask(ops.PROFILE, request, budget)["tasks"])

    def gpus(self, run_id: str | None = None) -> dict[str, Any]:
        """The `gpus` reply, bounded and its texts cleaned at the edge (GPU names, driver words
        are printed), each GPU index once; deployer.hosts.gpus.GpuReport.from_json reads it.
        With `run_id` each compute process says whether it belongs to that run."""
        request: protocol.GpusRequest = {"run_id": run_id} if run_id else {}
        reply = self.ask(ops.GPUS, request)
        edge, seen = Edge(self.host, protocol.OP_GPUS), set()
        for gpu in reply["gpus"]:  # a plan gives tasks GPUs by index: each names one GPU
            if gpu["index"] in seen:
                raise edge.error("gpus", f"list the GPU index {gpu['index']} twice")
            seen.add(gpu["index"])
        return dict(reply)

    def listen(self, run_id: str, ports: Sequence[int], seconds: float) -> None:
        """Stand-in listeners on the planned TF ports, for peers' probes (remote/netcheck.py)."""
        request: protocol.NetcheckRequest = {
            "action": protocol.NETCHECK_LISTEN,
            "run_id": run_id,
            "ports": list(ports),
            "seconds": seconds,
        }
        self.ask(ops.NETCHECK_LISTEN, request)

    def probe(self, run_id: str, targets: Sequence[tuple[str, int]], timeout: float) -> list[str]:
        """One verdict per (address, port): "ok", "refused", "timed out", "no route", ..."""
        request: protocol.NetcheckRequest = {
            "action": protocol.NETCHECK_PROBE,
            "run_id": run_id,
            "targets": [list(t) for t in targets],
            "wait": timeout,
        }
        budget = protocol.probe_budget(len(targets), timeout) + 30  # the host's whole queue
        reply = self.ask(ops.NETCHECK_PROBE, request, budget)
        return [text(r) for r in reply["results"]]

    def unlisten(self, run_id: str) -> None:
        request: protocol.NetcheckRequest = {"action": protocol.NETCHECK_CLOSE, "run_id": run_id}
        self.ask(ops.NETCHECK_CLOSE, request)

    def relay(
        self,
        run_id: str,
        address: str,
        port: int,
        secret: str,
        then: tuple[str, int] | None,
        seconds: float,
        store: Sequence[str] | None = None,
    ) -> None:
        """Listens on address:port for the fan-out's one stream, storing it (`store`: only these
        contents of it) and forwarding every piece to `then` as it arrives (remote/peers.py)."""
        request: protocol.PeersRequest = {
            "action": protocol.PEERS_RELAY,
            "run_id": run_id,
            "address": address,
            "port": port,
            "secret": secret,
            "next": list(then) if then is not None else None,
            "seconds": seconds,
        }
        if store is not None:
            request["store"] = list(store)
        self.ask(ops.PEERS_START, request)

    def stop_serving(self, run_id: str) -> None:
        request: protocol.PeersRequest = {"action": protocol.PEERS_CLOSE, "run_id": run_id}
        self.ask(ops.PEERS_CLOSE, request)

    def look(self) -> None:
        """Says hello once without creating anything on the host (read-only verbs)."""
        if self.home is None:
            self.look_in()

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
        reply = self.ask(ops.COLLECT, request, 600)
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
        pending: collections.deque[FetchReading] = collections.deque()
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
                        pending.append(FetchReading(order))
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
        reply = self.ask(ops.FIREWALL_CHECK, request)
        return text(reply["problem"]) if reply["problem"] else None

    def firewall_add(self, run_id: str, ports: Sequence[int], allowed: Sequence[str]) -> None:
        request: protocol.FirewallRequest = {
            "action": protocol.FIREWALL_ADD,
            "run_id": run_id,
            "ports": list(ports),
            "allowed": list(allowed),
        }
        self.ask(ops.FIREWALL_RULES, request)

    def firewall_remove(self, run_id: str) -> int:
        """Removes the run's rules (idempotent); how many rule sets were removed."""
        request: protocol.FirewallRequest = {"action": protocol.FIREWALL_REMOVE, "run_id": run_id}
        return self.ask(ops.FIREWALL_REMOVE, request)["removed"]

    def runs(self, hosts_of: str | None = None) -> list[protocol.RunShape]:
        """The runs on the host; the first call of a connection asks in its hello (one round
        trip for both), without creating anything on the host. A run's `hosts` come while it is
        active, and for the run `hosts_of` whatever its state."""
        if self.home is None:
            facts = self.look_in(runs=True, hosts_of=hosts_of)
            return [] if facts is None else list(facts["runs"])
        if self.absent:
            return []
        request: protocol.RunsRequest = {"hosts_of": hosts_of} if hosts_of else {}
        return list(self.ask(ops.RUNS, request)["runs"])

    def prune(
        self,
        keep: int,
        *,
        older_than: float | None = None,
        dry_run: bool = False,
        grace: float | None = None,
    ) -> protocol.PruneReply:
        """Removes this host's runs past the newest `keep` of each job (created before
        `older_than`), then the contents and environments no run uses (remote/prune.py); the
        names in the reply are a host's words, cleaned before they can be printed."""
        request: protocol.PruneRequest = {"keep": keep, "older_than": older_than}
        if dry_run:
            request["dry_run"] = True
        if grace is not None:
            request["grace"] = grace
        # A prune deletes trees of files (an environment holds tens of thousands): minutes.
        reply = self.ask(ops.PRUNE, request, 1800)
        for key in ("runs", "running", "environments", "checkpoints"):
            reply[key] = [text(name) for name in reply[key]]
        return reply


def _metric_lines(
    entries: list[protocol.MetricLinesShape], edge: Edge, asked: Mapping[str, int]
) -> dict[str, tuple[int, tuple[dict[str, float], ...]]]:
    """The poll's new metric lines per task: only tasks it asked about, offsets that only go
    forward, each line parsed as the task's untrusted word (replies.metric_record)."""
    found: dict[str, tuple[int, tuple[dict[str, float], ...]]] = {}
    for entry in entries:
        name = edge.task(entry["task"], "a metrics entry's task", asked)
        offset = edge.count(entry["offset"], f"{name}'s metrics offset")
        if offset < asked[name]:
            raise edge.error(f"{name}'s metrics offset", f"went back ({offset} < {asked[name]})")
        found[name] = (offset, metric_records(entry["lines"][:1024]))  # lines dropped counted
    return found
