"""Starting the job: TF's start order, the request each task is started with, and the start
phase that sends them wave after wave."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from deployer.config.model import Job
from deployer.config.plan import Plan, Task
from deployer.config.roles import role
from deployer.core.errors import JobFailed
from deployer.core.fold import fold_names
from deployer.core.text import plural
from deployer.hosts.agent import Agent
from deployer.hosts.fleet import Fleet, Member
from deployer.hosts.reply_types import TaskStatus
from deployer.hosts.task_runtime import TaskRuntime
from deployer.watch.loop import Watch
from deployer.watch.poller import Poller
from deployer.watch.progress import Progress, Ticker
from deployer.watch.runstate import RunState
from deployer.watch.view import Display
from remote import protocol

# What the agent answers a start in a run that `down` stopped (remote/taskops.py).


def start_groups(plan: Plan) -> list[list[Task]]:
    """ps and servers first, then workers, then the chief and evaluators.

    TF clients block on servers that are not up yet, and a PSS chief blocks until every server
    answers; starting in this order makes each group's wait short and a late server visible.
    """
    waves: dict[int, list[Task]] = {}
    for task in plan.tasks:
        wave = 0 if task.serves else role(task.role).start_wave
        waves.setdefault(wave, []).append(task)
    return [waves[w] for w in sorted(waves)]


def by_host(tasks: list[Task]) -> dict[str, list[Task]]:
    grouped: dict[str, list[Task]] = {}
    for task in tasks:
        grouped.setdefault(task.host, []).append(task)
    return grouped


SPOT_POLL_S = 5.0  # how often a spot host's supervisors ask for a notice (AWS advises 5 s)
SPOT_MARGIN_S = 15.0  # SIGKILL this long before the announced interruption time


def checkpoint_note(job: Job) -> str:
    """Where the tasks' TFDEPLOY_CHECKPOINT_DIR is, in words: its rule, said once a run."""
    value = job.checkpoint_dir
    where = (
        f"{value} on each host"
        if value is not None and value.startswith(("/", "~"))
        else f"job {job.name!r}'s own folder {value!r} on each host (under {job.workdir}/hosts/)"
    )
    return (
        f"checkpoints: TFDEPLOY_CHECKPOINT_DIR is {where}; every attempt and every later run "
        "of the job resumes from it"
    )


def start_request(
    task: Task,
    agent: Agent,
    run_id: str,
    forwarded: Mapping[str, str],
    attempt: int = 0,
    interruption_url: str | None = None,
    runtime: TaskRuntime | None = None,
) -> protocol.StartTask:
    """The `start` entry for one task: its command, and an env made only of what the plan and
    job.forward_env name (never the controller's environment implicitly). `runtime`: what the
    task runs in (default: the host's python, whose directory comes first on its PATH)."""
    runtime = runtime or TaskRuntime(python=agent.python)
    command = task.command
    if task.is_server:  # in an image, the agent's directory is mounted at the same path
        command = runtime.server_command(agent.agent_dir)
    request: protocol.StartTask = {
        "name": task.name,
        "command": command,
        "env": {
            **forwarded,
            **task.env,
            protocol.RUN_ID_ENV: run_id,
            protocol.ATTEMPT_ENV: str(attempt),
        },
    }
    runtime.apply(request)
    if task.checkpoint_dir is not None:
        request["checkpoint_dir"] = task.checkpoint_dir  # the host resolves and makes it
    if task.cpus is not None:
        request["cpus"] = task.cpus  # the supervisor pins the task before exec
    if interruption_url is not None:
        # A spot notice gives ~2 minutes: SIGTERM at once (TF's PreemptionCheckpointHandler
        # or the user's handler saves), SIGKILL only just before the machine goes.
        request["spot"] = {
            "url": interruption_url,
            "interval": SPOT_POLL_S,
            "margin": SPOT_MARGIN_S,
        }
    return request


def start_group(
    fleet: Fleet,
    tasks: list[Task],
    run_id: str,
    forwarded: Mapping[str, str],
    *,
    grace: float,
    on_started: Callable[[str, list[TaskStatus]], None],
    attempt: int = 0,
    release: Collection[str] = (),
    runtimes: Mapping[str, TaskRuntime] | None = None,
    resumed: bool = False,
) -> None:
    """Starts `tasks` on their hosts in parallel, then `on_started(host, statuses)` per host
    that answered (on this thread). Any host failing makes a JobFailed naming each such host;
    what other hosts started is left to the caller's teardown. The hosts in `release` drop
    the run's port reservations in the same request, once their tasks have started.
    `resumed` (`up --resume`): each task's log says where its resumed attempt begins.
    """
    grouped = by_host(tasks)

    def start_on(member: Member) -> list[TaskStatus]:
        url = member.host.interruption_url
        requests = [
            start_request(
                t, member.agent, run_id, forwarded, attempt, url, (runtimes or {}).get(t.name)
            )
            for t in grouped[member.name]
        ]
        return member.agent.start(
            run_id, requests, grace, release=member.name in release, resumed=resumed
        )

    started, failures = fleet.each_settled(start_on, [fleet.member(h) for h in grouped])
    for host, statuses in started.items():
        on_started(host, statuses)
    if failures and all(f.code == protocol.FAIL_RUN_STOPPED for f in failures):
        raise JobFailed(
            f"run {run_id} was stopped from elsewhere (`tfdeploy down`); nothing of it starts "
            "again",
            hint="every task started so far was stopped",
        )
    if failures:
        lines = "\n".join(f"  {f.message}" for f in failures)
        names = fold_names([t.name for t in tasks], join=", ".join)
        raise JobFailed(
            f"starting {names} failed on {plural(len(failures), 'host')}:\n{lines}",
            hint="every task started so far was stopped; fix the host and run up again",
        )


class StartPhase:
    """Every task started, wave after wave (servers awaited listening before the next wave),
    the run's port reservations given back, and the poller told whom to watch."""

    def __init__(
        self,
        fleet: Fleet,
        run: RunState,
        poller: Poller,
        watching: Watch,
        view: Display,
        forwarded: Mapping[str, str],
        on_start: Callable[[], None],
    ) -> None:
        self.fleet, self.run, self.poller, self.watching = fleet, run, poller, watching
        self.view, self.forwarded, self.on_start = view, forwarded, on_start
        self.ticker: Ticker | None = None  # the start's progress, while it starts
        self.resuming = False  # `up --resume`: its first start says so in each task's log

    def __call__(self, members: Sequence[Member]) -> None:
        plan = self.run.plan
        deadline = self.run.clock() + plan.job.start_timeout
        groups = start_groups(plan)
        released = released_with_start(groups)
        starting = Progress("starting", done=0, total=len(plan.tasks), unit="tasks started")
        self.ticker = ticker = Ticker(self.view, starting)
        try:
            for group in groups:
                self._start_group(group, released)
                servers = [t for t in group if t.serves and t.port is not None]
                if servers:
                    self.watching.wait_listening(servers, deadline)
        finally:
            self.ticker = None
            self.resuming = False  # a restart after it is no resume
            ticker.close()
        # Started tasks hold their ports now. A reservation left to its lease could outlive
        # the run: a heartbeat stuck in a cut link arrives when the link heals and renews it.
        # Most hosts dropped theirs with their last start; the others (a ps waited on) now.
        rest = [m for m in members if m.name not in released]
        self.fleet.each_settled(lambda m: m.agent.release(self.run.run_id), rest)
        count = len(plan.tasks)
        self.view.step("the task started" if count == 1 else f"all {count} tasks started")
        if plan.job.checkpoint_dir is not None:
            self.view.step(checkpoint_note(plan.job))

    def _start_group(self, tasks: list[Task], released: Collection[str]) -> None:
        self.on_start()
        for host in by_host(tasks):
            self.poller.watch_host(host)
        self.view.step(f"starting {fold_names([t.name for t in tasks], join=', '.join)}")
        board = self.run.board

        def started(host: str, statuses: list[TaskStatus]) -> None:
            self.poller.contact.reached(host, self.run.clock())
            board.update(statuses)
            if self.ticker is not None:
                self.ticker.add(len(statuses))

        start_group(
            self.fleet,
            tasks,
            self.run.run_id,
            self.forwarded,
            grace=self.run.plan.job.stop_grace,
            on_started=started,
            attempt=board.attempt,
            release=released,
            runtimes=self.run.runtimes,
            resumed=self.resuming,
        )


def released_with_start(groups: Sequence[Sequence[Task]]) -> set[str]:
    """The hosts that may drop their port reservations with their last start request: those
    whose last group serves no port that a later step waits on (wait_listening)."""
    last_serving: dict[str, bool] = {}  # host -> its last group serves a port on it
    for group in groups:
        serving = {t.host for t in group if t.serves and t.port is not None}
        for task in group:
            last_serving[task.host] = task.host in serving
    return {host for host, serves in last_serving.items() if not serves}
