"""A run's keeper: its failure policy and its end, held beside the hosts instead of in a terminal.

`up --detach` of a job whose failure policy restarts (on_failure = "restart" or "restart-job")
hands the run to a keeper on one of its own hosts: a detached process that polls every host's
warden (warden.py) over the cluster network, applies the policy the controller would have
applied, and ends the run when the job is done. Its polls are the run's heartbeat, so the run is
leased by the keeper: if the keeper's host dies, the other hosts stop the run when the lease
lapses, and no run is left orphaned. The rules are the controller's (deployer/watch/board.py):

- the first failure decides: an awaited task or a server that ended without exiting 0;
- "restart-job": a signal, an exit code of 128+ or one of retry_exit_codes stops every task
  (and what escaped them), waits restart_backoff (doubling, at most 300 s) and starts every
  task again as recorded, TFDEPLOY_ATTEMPT one higher, at most max_restarts times;
- "restart": the failed task alone started again, at most max_restarts times per task;
- otherwise, or with no restart left: every task stopped, the run failed;
- every awaited task exited 0: evaluators get evaluator_grace, the rest is stopped, done;
- before any of these, its guards (guards.py): the run's cost reached `max_cost`, or every GPU of
  it sat below `gpu_idle_stop`'s floor for its window: every task stopped, the run stopped.

What it did is kept in `keeper.json` in its run folder (attempts, each restart's cause, the
outcome), for `status` and the tests; it leaves when the run ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import daemon
import guards
import keepwire
import kept
import layout
import notify
import params
import protocol
import rejoin
import warden

MAX_BACKOFF_S = 300.0
ASK_TIMEOUT_S = 10.0
STATE_FILE = "keeper.json"


class Keeper:
    """One run's policy loop: a heartbeat thread polls every warden, the main thread judges."""

    def __init__(
        self,
        plan: dict[str, Any],
        secret: bytes,
        run_dir: Path,
        record: Path | None = None,
        requeued_job: str | None = None,
    ) -> None:
        self.run_id: str = plan["run_id"]
        self.hosts: dict[str, dict[str, Any]] = {h["name"]: h for h in plan["hosts"]}
        self.tasks: list[dict[str, Any]] = plan["tasks"]
        self.policy: dict[str, Any] = plan["policy"]
        self.interval = float(plan.get("interval", 1.0))
        self.loss_after = float(plan.get("loss_after", 30.0))
        self.attempt = int(plan.get("attempt", 0))
        self.secret = secret
        self.run_dir = run_dir
        self.statuses: dict[str, dict[str, Any]] = {}
        self.task_restarts: dict[str, int] = {}
        self.heard: dict[str, float] = {h: time.monotonic() for h in self.hosts}
        # An earlier keeper's restarts of this run (`up --resume`) go on being counted.
        self.history, self.restarts = _earlier_restarts(run_dir, self.run_id)
        self.lock = threading.Lock()  # statuses and heard, shared with the heartbeat thread
        self.done = threading.Event()
        self.fresh_after = 0.0  # polls asked before this (the last restart) are not believed
        # The last restart's recovery being timed: when its failure was seen, and the metrics
        # size of each restarted task before it started again (its first new record ends it).
        self.recovering: tuple[float, dict[str, int]] | None = None
        self.job = str(plan.get("job") or "")
        self.noting = threading.Lock()  # keeper.json's writers: this loop and the notifier
        self.record = record  # this keeper's daemon record (`alive`, a whole-run stop read it)
        self.notifier = notify.Notifier(plan.get("notify"), lambda s: self.note({"notify": s}))
        self.requeued_job = requeued_job  # started again by its allocation's holder (rejoin.py)
        gpus = [(t["host"], i) for t in self.tasks for i in t.get("gpus") or []]
        self.guards = guards.Guards.from_plan(plan.get("guards") or {}, gpus, time.monotonic())
        self.gpu_samples = guards.GpuSamples()  # the wardens' last, for the idle guard

    # ---- talking to the wardens ----------------------------------------------------------

    def ask(self, host: str, request: dict[str, Any], timeout: float = ASK_TIMEOUT_S) -> Any:
        where = self.hosts[host]
        reply = keepwire.ask(
            where["address"],
            where["port"],
            self.secret,
            {**request, "run_id": self.run_id},
            timeout,
        )
        if not isinstance(reply, dict) or not reply.get("ok"):
            said = reply.get("error") if isinstance(reply, dict) else reply
            raise keepwire.WireError(f"{host} refused: {str(said)[:300]}")
        with self.lock:
            self.heard[host] = time.monotonic()
        return reply

    def beat(self) -> None:
        """The heartbeat, on a thread of its own: every host polled at once each interval, so
        a slow stop or one silent host never lets the other hosts' leases lapse."""
        while not self.done.is_set():
            asked = time.monotonic()

            def one(host: str, asked: float = asked) -> None:
                self.poll_one(host, asked)

            self.each(list(self.hosts), one)
            self.done.wait(self.interval)

    def poll_one(self, host: str, asked: float) -> None:
        ports = [t["port"] for t in self.tasks if t["host"] == host and t.get("port")]
        request: dict[str, Any] = {"ask": warden.POLL, "ports": ports}
        if self.guards.wants_gpus(host):
            request["gpus"] = True
        try:
            timeout = min(ASK_TIMEOUT_S, max(1.0, self.loss_after / 3))
            reply = self.ask(host, request, timeout)
        except (OSError, keepwire.WireError):
            return
        self.gpu_samples.note(host, reply.get("gpus"), time.monotonic())
        with self.lock:
            if asked < self.fresh_after:
                return  # asked before the last restart: the old attempt's word
            for status in reply.get("tasks", []):
                if isinstance(status, dict) and isinstance(status.get("name"), str):
                    self.statuses[status["name"]] = status

    def each(self, hosts: list[str], fn: Any) -> list[Any]:
        """fn(host) for every host at once; what each returned (or raised), in order."""
        if not hosts:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            futures = [pool.submit(fn, h) for h in hosts]
        return [f.exception() or f.result() for f in futures]

    def on_hosts(self, op: str, names: list[str], **extra: Any) -> None:
        """`op` (stop, restart) for the named tasks on every host at once; a host that cannot
        be reached is retried until the loss window ends, then the run fails."""
        by_host: dict[str, list[str]] = {}
        for task in self.tasks:
            if task["name"] in names:
                by_host.setdefault(task["host"], []).append(task["name"])
        timeout = 2 * float(self.policy.get("stop_grace", 10)) + 60

        def act(host: str) -> str | None:
            deadline = time.monotonic() + self.loss_after
            while True:
                try:
                    self.ask(host, {"ask": op, "tasks": by_host[host], **extra}, timeout)
                    return None
                except (OSError, keepwire.WireError) as exc:
                    if time.monotonic() > deadline or self.done.is_set():
                        return f"{op} on {host} failed: {exc}"
                    time.sleep(self.interval)

        failed = [f for f in self.each(list(by_host), act) if f is not None]
        if failed:
            raise Ended("failed", str(failed[0]))

    def forget_attempt(self) -> None:
        """What the polls said of the last attempt is forgotten (a restart began)."""
        with self.lock:
            self.statuses.clear()
            self.fresh_after = time.monotonic()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return dict(self.statuses)

    # ---- the policy ---------------------------------------------------------------------------

    def judge(self) -> None:
        """One look at the run: raises Ended when it is over; restarts what the policy says."""
        now = time.monotonic()
        self.guard(now)
        with self.lock:
            lost = [h for h, t in self.heard.items() if now - t > self.loss_after]
        if lost:
            cause = f"host {lost[0]} was lost (no answer for {self.loss_after:g} s)"
            if self.policy.get("on_failure") == RESTART_JOB and self.attempt < self.most():
                self.restart_job(cause)  # its tasks stopped by their lease: it may come back
                return
            self.stop_all(tolerant=True)
            raise Ended("failed", cause)
        statuses = self.snapshot()
        self.time_recovery(statuses)
        stopped = [n for n, s in statuses.items() if s.get("reason") == protocol.REASON_STOPPED]
        if stopped:  # not by this keeper, which forgets what it stopped: `down`, or a person
            self.stop_all(tolerant=True)
            raise Ended("stopped", f"{stopped[0]} was stopped from elsewhere")
        awaited = [t["name"] for t in self.tasks if t.get("awaited")]
        failed = first_failure(statuses, awaited, self.tasks)
        if failed is not None:
            self.on_failure(failed, statuses[failed])
            return
        if awaited and all(_succeeded(statuses.get(n)) for n in awaited):
            self.finish()
            raise Ended("succeeded", "")

    def guard(self, now: float) -> None:
        """The run's guards (guards.py): one that says so stops every task and the run. Its
        words are noted first, so that whoever watches the tasks stop can say why (`status`,
        `attach`: the runs op reads them, guard_stop)."""
        said = self.guards.look(now, self.gpu_samples.fresh(now))
        if said is None:
            return
        name, why = said
        self.note({"guard": name, "why": why})
        self.stop_all(tolerant=True)
        raise Ended("stopped", why, guard=name)

    def on_failure(self, name: str, status: dict[str, Any]) -> None:
        cause = f"{name} {_outcome(status)}"
        policy, most = self.policy.get("on_failure"), self.most()
        if policy == RESTART_JOB and retryable(status, self.policy) and self.attempt < most:
            self.restart_job(cause)
        elif (
            policy == RESTART
            and _task(self.tasks, name).get("restartable")
            and status.get("reason") not in NOT_RESTARTED
            and self.task_restarts.get(name, 0) < most
        ):
            self.task_restarts[name] = self.task_restarts.get(name, 0) + 1
            seen, before = time.time(), _metrics_bytes(self.snapshot())
            self.note({"restart": name, "cause": cause})
            self.on_hosts(warden.RESTART, [name], attempt=self.attempt)
            self.forget_attempt()  # a poll asked before the restart still sees it failed
            self.note({"started": self.attempt, "task": name, "after_s": _since(seen)})
            self.recovering = (seen, {name: before.get(name, 0)})
            self.tell("recovered", outcome="running", why=cause)
        else:
            self.stop_all(tolerant=True)
            raise Ended("failed", cause)

    def most(self) -> int:
        return int(self.policy.get("max_restarts", 0))

    def restart_job(self, cause: str) -> None:
        """Every task stopped (and what escaped them), the backoff waited, every task started
        again wave by wave (servers first) with the next TFDEPLOY_ATTEMPT. A host that cannot
        be reached (lost, or not back yet) takes the next restart's backoff too, until
        max_restarts are used up; its tasks are stopped by their lease meanwhile."""
        seen = time.time()
        while True:
            self.attempt += 1
            backoff = min(
                float(self.policy.get("restart_backoff", 10)) * 2.0 ** (self.attempt - 1),
                MAX_BACKOFF_S,
            )
            self.note({"restart_job": self.attempt, "cause": cause, "backoff": backoff})
            self.stop_all(tolerant=True)
            self.wait(max(backoff, self.interval))
            try:
                self.stop_all()  # a host back since: what its lease has not stopped yet
                before = _metrics_bytes(self.snapshot())  # the stopped attempt's last sizes
                for wave in sorted({int(t.get("wave", 0)) for t in self.tasks}):
                    names = [t["name"] for t in self.tasks if int(t.get("wave", 0)) == wave]
                    self.on_hosts(warden.RESTART, names, attempt=self.attempt)
            except Ended as failed:
                if self.attempt >= self.most():
                    raise
                cause = f"{failed.why}: waiting for it"
                continue
            break
        self.forget_attempt()  # a poll asked before the last start still sees the stopped tasks
        with self.lock:
            self.heard = {h: time.monotonic() for h in self.hosts}
        self.note({"started": self.attempt, "after_s": _since(seen)})
        self.recovering = (seen, before)
        self.tell("recovered", outcome="running", why=cause)

    def tell(self, event: str, **fields: Any) -> None:
        """[job.notify] hears of it (notify.py): the keeper holds the run, so it tells."""
        doc = notify.document(event, self.run_id, self.job, "keeper", attempt=self.attempt)
        self.notifier.fire({**doc, **fields})

    def time_recovery(self, statuses: dict[str, dict[str, Any]]) -> None:
        """The restarted attempt trains again once a task writes a step record it had not
        written before the restart: that moment, from the failure's, is the recovery time.
        A job that writes no metrics has no such moment; its `started` time is what is known."""
        if self.recovering is None:
            return
        seen, before = self.recovering
        grown = _metrics_bytes(statuses)
        if any(grown.get(name, 0) > size for name, size in before.items()):
            self.note({"stepping": self.attempt, "after_s": _since(seen)})
            self.recovering = None

    def finish(self) -> None:
        """Every awaited task exited 0: evaluators get their grace, then the rest is stopped."""
        evaluators = [t["name"] for t in self.tasks if t.get("evaluator")]
        deadline = time.monotonic() + float(self.policy.get("evaluator_grace", 0))
        while evaluators and time.monotonic() < deadline:
            if all(_finished(self.snapshot().get(n)) for n in evaluators):
                break
            self.wait(self.interval)
        self.stop_all()

    def stop_all(self, *, tolerant: bool = False) -> None:
        """Every task of the run stopped, and what escaped them (an exited one stays as it is).
        `tolerant`: the run ends anyway; a host that cannot be told stops by its lease."""
        try:
            self.on_hosts(warden.STOP, self.names(), grace=float(self.policy.get("stop_grace", 10)))
        except Ended:
            if not tolerant:
                raise

    def names(self) -> list[str]:
        return [t["name"] for t in self.tasks]

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.note({"kept": True})
        heart = threading.Thread(target=self.beat, daemon=True)
        heart.start()
        try:
            if self.requeued_job is not None:
                self.rejoin(self.requeued_job)
            while True:
                self.wait(self.interval)
                self.judge()
        except Ended as end:
            outcome = {"outcome": end.outcome, "why": end.why, "attempt": self.attempt}
            # A stop by Slurm's requeue (no stop marker of tfdeploy's) is rejoined, no other end.
            final = end.outcome != "stopped" or end.guard or layout.run_stopped(self.run_dir)
            if final:
                rejoin.forget(self.run_dir)
            self.note({"ended": outcome})
            self.tell("failed" if end.outcome == "failed" else "finished", **outcome)
            self.done.set()
            heart.join(timeout=ASK_TIMEOUT_S)
            for host in self.hosts:
                with contextlib.suppress(OSError, keepwire.WireError):
                    self.ask(host, {"ask": warden.END, "final": final}, timeout=5.0)
            # The run is over for everyone now: no longer its keeper (`runs` says it ended,
            # `down` has nothing to stop), only the sender of its last word, bounded.
            if self.record is not None:
                with contextlib.suppress(OSError):
                    self.record.unlink()
            self.notifier.wait()
            return outcome

    def rejoin(self, job: str) -> None:
        """Slurm requeued the allocation and it runs again: every task ended with the old
        steps, so the whole job starts again, as after a lost host, while restarts are left."""
        cause = f"Slurm requeued allocation {job}"
        self.note({"rejoined": job})
        if self.policy.get("on_failure") == RESTART_JOB and self.attempt < self.most():
            self.restart_job(cause)
            return
        self.stop_all(tolerant=True)
        raise Ended("failed", f"{cause} and no restart is left (max_restarts)")

    def wait(self, seconds: float) -> None:
        """`seconds` pass; the heartbeat thread polls meanwhile."""
        self.done.wait(seconds)

    def note(self, event: dict[str, Any]) -> None:
        """One event into keeper.json; the notifier's thread notes too, hence the lock (the
        record's temporary file is named by pid, not by thread)."""
        with self.noting:
            self.history.append({"t": round(time.time(), 3), **event})
            if _is_restart(event):
                self.restarts += 1
            state = {
                "run_id": self.run_id,
                "attempt": self.attempt,
                "restarts": self.restarts,
                "events": self.history[-200:],
            }
            with contextlib.suppress(OSError):  # a full disk loses the record, never the run
                layout.write_json(self.run_dir / STATE_FILE, state)


class Ended(Exception):
    """The run is over: its outcome (succeeded, failed, stopped) and why; `guard`: the guard
    that stopped it (guards.py), if one did."""

    def __init__(self, outcome: str, why: str, guard: str = "") -> None:
        super().__init__(outcome)
        self.outcome, self.why, self.guard = outcome, why, guard


NOT_RESTARTED = (protocol.REASON_STOPPED, protocol.REASON_LEASE_EXPIRED, protocol.REASON_PREEMPTED)
RESTART, RESTART_JOB = "restart", "restart-job"  # job.on_failure's words (config/model.py)


def first_failure(
    statuses: dict[str, dict[str, Any]], awaited: list[str], tasks: list[dict[str, Any]]
) -> str | None:
    """As the controller's rule (deployer/watch/board.py): the first awaited task or server to
    end without exiting 0, by when it ended."""
    judged = set(awaited) | {t["name"] for t in tasks if t.get("serves")}
    failed = [
        (s.get("ended") or 0.0, name)
        for name, s in statuses.items()
        if name in judged and _finished(s) and not _succeeded(s)
    ]
    return min(failed)[1] if failed else None


def retryable(status: dict[str, Any], policy: dict[str, Any]) -> bool:
    """As the controller's rule (deployer/watch/board.py retryable): a signal, a preemption,
    a lost task, an exit code of 128+ or one of retry_exit_codes."""
    if _time_limited(status):
        return False  # its allocation is ending: a restart inside it would be cut again
    if status.get("state") == protocol.STATE_LOST or status.get("signal") is not None:
        return True
    if status.get("reason") == protocol.REASON_PREEMPTED:
        return True
    code = status.get("exit_code")
    return code is None or code >= 128 or code in (policy.get("retry_exit_codes") or [])


def _metrics_bytes(statuses: dict[str, dict[str, Any]]) -> dict[str, int]:
    sizes = {n: s.get("metrics_bytes") for n, s in statuses.items()}
    return {n: v for n, v in sizes.items() if isinstance(v, int) and not isinstance(v, bool)}


def _since(seen: float) -> float:
    return round(time.time() - seen, 2)


def _task(tasks: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((t for t in tasks if t["name"] == name), {})


def _finished(status: dict[str, Any] | None) -> bool:
    return status is not None and status.get("state") in (
        protocol.STATE_EXITED,
        protocol.STATE_LOST,
    )


def _succeeded(status: dict[str, Any] | None) -> bool:
    return (
        status is not None
        and status.get("state") == protocol.STATE_EXITED
        and status.get("exit_code") == 0
        and status.get("reason") != protocol.REASON_PREEMPTED
    )


def _time_limited(status: dict[str, Any]) -> bool:
    notice = status.get("notice")
    return isinstance(notice, dict) and notice.get("action") == protocol.NOTICE_TIME_LIMIT


def _outcome(status: dict[str, Any]) -> str:
    if _time_limited(status):
        return "ended at its allocation's time-limit warning (not restarted)"
    if status.get("signal") is not None:
        return f"was killed by signal {status['signal']}"
    if status.get("state") == protocol.STATE_LOST:
        return "was lost"
    return f"exited {status.get('exit_code')}"


def _earlier_restarts(run_dir: Path, run_id: str) -> tuple[list[dict[str, Any]], int]:
    """The restarts an earlier keeper of the run recorded here (the run was resumed after it
    ended): their events, each with its recovery's timings, and their count. Its end and its
    other events are not carried: the run is not over, and `ended` would say so."""
    state = layout.read_json(run_dir / STATE_FILE)
    if not isinstance(state, dict) or state.get("run_id") != run_id:
        return [], 0
    events = state.get("events")
    kinds = ("restart", "restart_job", "started", "stepping")
    kept = [
        e
        for e in (events if isinstance(events, list) else [])
        if isinstance(e, dict) and any(k in e for k in kinds)
    ]
    return kept[-200:], _restart_count(state, sum(1 for e in kept if _is_restart(e)))


def _is_restart(event: dict[str, Any]) -> bool:
    """A restart the keeper made: of the whole job, or of one task."""
    return "restart_job" in event or "restart" in event


def _restart_count(state: dict[str, Any], listed: int) -> int:
    """How many restarts a record holds in all: the count the keeper kept beside its events
    (it keeps only the newest 200, two or three a restart), or those listed when more."""
    count = state.get("restarts")
    counted = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return max(counted, listed)


# ---- what `status` reads of it ---------------------------------------------------------------

MAX_RECOVERIES = 20  # the newest ones a runs reply carries (a run restarted 1,000 times)


def recoveries(run_dir: Path) -> tuple[int, list[protocol.RecoveryShape]]:
    """The keeper's restarts of the run, from its record: how many in all, and the newest
    MAX_RECOVERIES of them, newest last: each one's attempt, the failure that caused it (and
    the task, for a task restart), its backoff, and how long after the failure was seen the
    tasks ran again (`started_after_s`) and trained again (`stepping_after_s`: a new step
    record). (0, []) where this host kept no record. The count is apart from the list, so a
    run restarted 1,000 times says 1,000 with a bounded reply."""
    state = layout.read_json(run_dir / STATE_FILE)
    events = state.get("events") if isinstance(state, dict) else None
    found: list[protocol.RecoveryShape] = []
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict):
            continue
        if _is_restart(event):
            found.append(_recovery(event))
        elif found and "started" in event:
            found[-1]["started_after_s"] = _seconds(event.get("after_s"))
        elif found and "stepping" in event:
            found[-1]["stepping_after_s"] = _seconds(event.get("after_s"))
    whole = _restart_count(state, len(found)) if isinstance(state, dict) else len(found)
    return whole, found[-MAX_RECOVERIES:]


def guard_stop(run_dir: Path) -> str | None:
    """Why the keeper's guard stopped the run (`its cost reached max_cost $25.00 (spent
    $25.01)`), from its record; None where none did, or this host kept no record. Noted before
    the stop, so a watcher that sees the tasks stop can already say why."""
    state = layout.read_json(run_dir / STATE_FILE)
    events = state.get("events") if isinstance(state, dict) else None
    for event in reversed(events if isinstance(events, list) else []):
        if isinstance(event, dict) and "guard" in event and isinstance(event.get("why"), str):
            return str(event["why"])[:300]
    return None


def _recovery(event: dict[str, Any]) -> protocol.RecoveryShape:
    attempt = event.get("restart_job")
    task = event.get("restart")
    return {
        "attempt": attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0,
        "task": task if isinstance(task, str) else None,
        "cause": str(event.get("cause", ""))[:300],
        "backoff": _seconds(event.get("backoff")),
        "started_after_s": None,
        "stepping_after_s": None,
    }


def _seconds(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


# ---- the agent op that starts one -------------------------------------------------------------


def op_keep(req: dict[str, Any]) -> dict[str, Any]:
    """`keep`: action "warden" starts this host's warden of the run (its port in the reply),
    "keeper" starts the run's keeper here, with the plan and the wardens' addresses."""
    action = params.param(req, "action", str)
    if action == protocol.KEEP_WARDEN:
        return warden.start(req)
    if action == protocol.KEEP_KEEPER:
        return start(req)
    raise params.AgentError(f"keep action must be warden or keeper, not {action!r:.40}")


def start(req: dict[str, Any], requeued_job: str | None = None) -> dict[str, Any]:
    """Starts the run's keeper on this host, detached; its record lets a whole-run stop end it.
    `requeued_job`: Slurm requeued the run's allocation, whose holder starts it again
    (rejoin.py): it goes on from the attempt its predecessor reached."""
    workdir = layout.workdir_path(req)
    run_dir = layout.run_path(req)
    secret = warden.secret_of(req)
    plan = check_plan(params.param(req, "plan", dict), run_dir.name)
    if requeued_job is not None:
        state = layout.read_json(run_dir / STATE_FILE)
        reached = state.get("attempt") if isinstance(state, dict) else None
        if isinstance(reached, int) and not isinstance(reached, bool) and reached >= 0:
            plan = {**plan, "attempt": reached}
    record = kept.record_path(workdir, run_dir.name, "keeper")
    daemon.stop(record)
    pid = daemon.spawn(
        record,
        lambda: Keeper(plan, secret, run_dir, record, requeued_job).run() and None,
        b"tfd-keeper",
    )
    rejoin.record(req, run_dir)
    return {"pid": pid}


def check_plan(plan: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The controller's plan of the run, in the form the loop reads (a wrong one is refused
    here, over SSH, rather than found by a keeper no one watches)."""
    hosts = params.param(plan, "hosts", list)
    tasks = params.param(plan, "tasks", list)
    policy = params.param(plan, "policy", dict)
    for host in hosts:
        if not (isinstance(host, dict) and isinstance(host.get("name"), str)):
            raise params.AgentError("each of the keeper's hosts needs a name")
        params.param(host, "address", str)
        params.param(host, "port", int)
    names = {h["name"] for h in hosts}
    for task in tasks:
        if not isinstance(task, dict) or params.param(task, "host", str) not in names:
            raise params.AgentError("each of the keeper's tasks needs one of its hosts")
        params.task_dirname(params.param(task, "name", str))
        gpus = params.param(task, "gpus", list, [])
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in gpus):
            raise params.AgentError("a keeper's task's gpus must be GPU indices")
    params.param(policy, "on_failure", str)
    try:
        guards.Guards.from_plan(params.param(plan, "guards", dict, {}), (), 0.0)
    except ValueError as exc:
        raise params.AgentError(str(exc)) from None
    told = params.param(plan, "notify", dict, None)
    if told is not None:
        for key in ("webhook", "command"):
            params.param(told, key, str, None)
        params.param(told, "events", list, [])
    return {**plan, "run_id": run_id}
