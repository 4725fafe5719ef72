"""The start and stop ops: launch detached supervisors, stop process groups on a deadline."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import containers
import daemon
import exits
import layout
import params
import procs
import protocol
import reservations
import strays

START_TIMEOUT = 10.0
STOP_SLACK = 5.0  # after SIGKILL, how long a supervisor gets to record the exit
POLL = 0.05
DEFAULT_GRACE = 10.0


def grace_param(req: dict[str, Any]) -> float:
    grace = float(params.param(req, "grace", (int, float), DEFAULT_GRACE))
    if grace < 0:
        raise params.AgentError(f"grace must be zero or more seconds, got {grace}")
    return grace


def op_start(req: dict[str, Any]) -> protocol.TasksReply:
    run_dir = layout.run_path(req)
    grace = grace_param(req)
    specs = [_task_spec(item, run_dir) for item in params.param(req, "tasks", list)]
    for spec in specs:
        _give_checkpoint_dir(spec, layout.workdir_path(req), run_dir)
    dirnames = [params.task_dirname(s["name"]) for s in specs]
    if len(set(dirnames)) != len(dirnames):
        raise params.AgentError(
            "two tasks of the request share a name (worker:1 and worker-1 clash)"
        )
    # Under the run lock, so a whole-run stop sees either none or all of these tasks.
    with layout.run_lock(run_dir):
        if layout.run_stopped(run_dir):
            raise layout.StoppedRun(run_dir.name)
        for spec, dirname in zip(specs, dirnames):
            if procs.task_state(run_dir / "tasks" / dirname)[0] == protocol.STATE_RUNNING:
                raise params.AgentError(
                    f"task {spec['name']} of run {run_dir.name} is still running"
                )
        layout.touch(
            run_dir / "lease"
        )  # setup may have outlasted the lease; starting is a heartbeat
        resumed = params.param(req, "resumed", bool, False)
        launched = [
            (task_dir, _launch(run_dir, task_dir, spec, grace, resumed=resumed))
            for spec, dirname in zip(specs, dirnames)
            for task_dir in [layout.make_private_dir(run_dir / "tasks" / dirname)]
        ]
        _wait_started(launched)
    if params.param(req, "release", bool, False):  # the host's last start: one round trip less
        reservations.hand_over(layout.workdir_path(req), run_dir.name)
    return {"tasks": [procs.task_status(task_dir) for task_dir, _ in launched]}


def relaunch(run_dir: Path, names: list[str], attempt: int) -> list[protocol.TaskStatusShape]:
    """The named tasks started again exactly as recorded (spec.json: the command, environment
    and container the controller's start asked for), only TFDEPLOY_ATTEMPT set to `attempt`:
    what a run's keeper may do (keeper.py), which can start no command the controller did not."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt < 10**6:
        raise params.AgentError(f"attempt must be a whole number, got {attempt!r:.20}")
    with layout.run_lock(run_dir):
        if layout.run_stopped(run_dir):
            raise layout.StoppedRun(run_dir.name)
        launched = []
        for name in names:
            task_dir = run_dir / "tasks" / params.task_dirname(name)
            spec = layout.read_json(task_dir / "spec.json")
            if not isinstance(spec, dict):
                raise params.AgentError(f"run {run_dir.name} has no recorded task {name}")
            if procs.task_state(task_dir)[0] == protocol.STATE_RUNNING:
                raise params.AgentError(f"task {name} of run {run_dir.name} is still running")
            env = {**spec.get("env", {}), protocol.ATTEMPT_ENV: str(attempt)}
            fields = {k: v for k, v in spec.items() if k not in ("grace", "restarts")}
            grace = float(spec.get("grace", DEFAULT_GRACE))
            launched.append((task_dir, _launch(run_dir, task_dir, {**fields, "env": env}, grace)))
        layout.touch(run_dir / "lease")
        _wait_started(launched)
    return [procs.task_status(task_dir) for task_dir, _ in launched]


def _task_spec(item: Any, run_dir: Path) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise params.AgentError(f"each task must be an object (name, command), got {item!r:.80}")
    name = params.param(item, "name", str)
    params.task_dirname(name)
    command = params.param(item, "command", str)
    if not command.strip():
        raise params.AgentError(f"task {name} has an empty command")
    env = params.check_env(params.param(item, "env", dict, {}))
    cwd = params.param(item, "cwd", str, None)
    path = layout.task_cwd(run_dir, cwd)
    if cwd is not None and not path.is_dir():
        raise params.AgentError(
            f"task {name} has cwd {cwd!r}, which is not a directory on this host"
        )
    spec = {"name": name, "command": command, "env": env, "cwd": cwd}
    cpus = params.param(item, "cpus", str, None)
    if cpus is not None:
        spec["cpus"] = sorted(cpu_list(cpus, name))
    spot_item = params.param(item, "spot", dict, None)
    if spot_item is not None:
        spec["spot"] = spot_spec(spot_item, name)
    # Which Python the task's `python3` is: the job's venv activated, or the host python's
    # directory first on PATH (interpreters.py); the supervisor applies it.
    for key in ("venv", "python"):
        value = params.param(item, key, str, None)
        if value is not None:
            spec[key] = value
    container = params.param(item, "container", dict, None)
    if container is not None:
        spec["container"] = container_spec(container, name)
    checkpoint = params.param(item, "checkpoint_dir", str, None)
    if checkpoint is not None:
        spec["checkpoint_dir"] = checkpoint
    return spec


def checkpoint_path(workdir: Path, job: str, value: str) -> Path:
    """[job] checkpoint_dir on this host: absolute or ~ as written (the user's folder, shared
    storage), else the job's own folder under the workdir, which every run of the job finds
    (WORKDIR/hosts/<identity>/jobs/<job>/<value>: each host its own, on a shared home too)."""
    if value.startswith(("/", "~")):
        return Path(os.path.expanduser(value))
    params.check_name(job, "job name")
    return layout.host_dir(workdir) / "jobs" / job / params.check_relpath(value)


def _give_checkpoint_dir(spec: dict[str, Any], workdir: Path, run_dir: Path) -> None:
    """The task's TFDEPLOY_CHECKPOINT_DIR, made here (0700) before it starts; it rides in the
    task's recorded env, so a keeper's restart finds the same folder."""
    value = spec.pop("checkpoint_dir", None)
    if value is None:
        return
    meta = layout.read_json(run_dir / "run.json")
    job = meta.get("job") if isinstance(meta, dict) else None
    if not isinstance(job, str):
        raise params.AgentError(f"run {run_dir.name} has no job name for its checkpoint_dir")
    path = checkpoint_path(workdir, job, value)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise params.AgentError(
            f"task {spec['name']}: checkpoint_dir {str(path)!r} cannot be made: {exc}"
        ) from None
    if not path.is_dir():
        raise params.AgentError(f"task {spec['name']}: checkpoint_dir {str(path)!r} is no folder")
    spec["env"] = {**spec["env"], protocol.CHECKPOINT_ENV: str(path)}


def container_spec(item: dict[str, Any], name: str) -> dict[str, Any]:
    """A task's `container` checked: the supervisor runs the task in this image (containers.py)."""
    try:
        runtime = params.param(item, "runtime", str)
        image = params.param(item, "image", str)
        mounts = params.param(item, "mounts", list, [])
        gpus = params.param(item, "gpus", list, [])
        rootless = params.param(item, "rootless", bool, False)
    except params.AgentError as exc:
        raise params.AgentError(f"task {name}: container: {exc}") from None
    if runtime not in containers.RUNTIMES or not image or image.startswith("-"):
        raise params.AgentError(f"task {name}: container runtime {runtime!r} / image {image!r}")
    if not all(isinstance(m, str) and _mount_ok(m) for m in mounts):
        raise params.AgentError(f"task {name}: container mounts must be absolute paths (PATH:ro)")
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
        raise params.AgentError(f"task {name}: container gpus must be GPU indices")
    return {
        "runtime": runtime,
        "image": image,
        "mounts": mounts,
        "gpus": gpus,
        "rootless": rootless,
    }


def _mount_ok(mount: str) -> bool:
    path = mount[:-3] if mount.endswith(":ro") else mount
    return os.path.isabs(path) and ":" not in path and "," not in path


def remove_containers(run_dir: Path) -> list[str]:
    """Every container of the run force-removed, for each runtime its tasks ran in: the last
    step of a whole-run stop (`down`, a lease that expired, a supervisor that died), since a
    SIGKILL of a task's group ends the runtime's client, not the container conmon keeps."""
    runtimes = set()
    for task_dir in layout.task_dirs(run_dir):
        spec = layout.read_json(task_dir / "spec.json")
        if isinstance(spec, dict) and isinstance(spec.get("container"), dict):
            runtimes.add(str(spec["container"].get("runtime")))
    removed: list[str] = []
    for runtime in sorted(runtimes & set(containers.RUNTIMES)):
        removed += containers.remove_run(runtime, run_dir.name)
    return removed


def spot_spec(item: dict[str, Any], name: str) -> dict[str, Any]:
    """A task's `spot` item with its defaults filled in: what its supervisor will poll.

    Checked here, so a typo is the start op's error instead of a poller that never hears a
    notice. Imported here: only starts of spot tasks pay for spot's imports (~5 ms).
    """
    import spot

    unknown = sorted(set(item) - set(spot.SPEC_KEYS))
    if unknown:
        known = ", ".join(spot.SPEC_KEYS)
        raise params.AgentError(f"task {name}: spot has unknown keys {unknown} (known: {known})")
    try:
        url = params.param(item, "url", str, spot.DEFAULT_URL)
        interval = float(params.param(item, "interval", (int, float), spot.DEFAULT_INTERVAL))
        margin = float(params.param(item, "margin", (int, float), spot.DEFAULT_MARGIN))
    except params.AgentError as exc:
        raise params.AgentError(f"task {name}: spot: {exc}") from None
    problem = spot.url_problem(url)
    if problem is not None:
        raise params.AgentError(f"task {name}: spot url {url!r} is not usable: {problem}")
    if not (math.isfinite(interval) and interval > 0):
        raise params.AgentError(f"task {name}: spot interval must be more than 0 s, got {interval}")
    if not (math.isfinite(margin) and margin >= 0):
        raise params.AgentError(f"task {name}: spot margin must be 0 s or more, got {margin}")
    return {"url": url, "interval": interval, "margin": margin}


def cpu_list(text: str, name: str) -> set[int]:
    """ "0-3,6" -> {0, 1, 2, 3, 6}; every CPU must be one this host lets us run on."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise params.AgentError(
            f"task {name}: cpus must be a list such as '0-3' or '0,2'"
        ) from None
    usable = os.sched_getaffinity(0)
    if not cpus or not cpus <= usable:
        have = ",".join(str(c) for c in sorted(usable))
        raise params.AgentError(
            f"task {name}: cpus {text!r} are not all on this host (CPUs {have})"
        )
    return cpus


def _launch(
    run_dir: Path, task_dir: Path, spec: dict[str, Any], grace: float, *, resumed: bool = False
) -> int:
    # Starting a task that already ran is a restart (failure policy "restart"): count it, so
    # `status` shows it long after the controller that decided it is gone.
    old = layout.read_json(task_dir / "spec.json")
    if resumed:  # `up --resume`: its log goes on, and says where the new attempt begins
        _say_resumed(task_dir, run_dir.name, spec["env"].get(protocol.ATTEMPT_ENV, "?"))
    restarts = int(old.get("restarts") or 0) if isinstance(old, dict) else 0
    if (task_dir / "exit.json").exists():
        restarts += 1
    for stale in ("exit.json", "pid.json", "stop"):
        (task_dir / stale).unlink(missing_ok=True)
    record = {**spec, "grace": grace, "restarts": restarts}
    layout.write_json(task_dir / "spec.json", record, mode=0o600)
    import supervisor  # only starts pay for its imports

    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    log_fd = os.open(task_dir / "supervisor.log", flags, 0o600)
    try:
        return supervisor.fork(run_dir, task_dir, log_fd)
    finally:
        os.close(log_fd)


def _say_resumed(task_dir: Path, run_id: str, attempt: str) -> None:
    """One line in the task's output.log before its resumed attempt's first (a full disk
    skips it: the start must not fail for a line)."""
    line = f"tfdeploy: run {run_id} resumed by `tfdeploy up --resume` (attempt {attempt})\n"
    with contextlib.suppress(OSError):
        fd = os.open(task_dir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _wait_started(launched: list[tuple[Path, int]]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    pending = list(launched)
    while pending and time.monotonic() < deadline:
        still = []
        for task_dir, pid in pending:
            if _recorded(task_dir):
                continue
            status = _ended(pid)
            if status is None:
                still.append((task_dir, pid))
            elif not _recorded(task_dir):
                # Looked at again: a quick task's supervisor may have written both records and
                # exited since the first look. Only one gone without a record died.
                log = (task_dir / "supervisor.log").read_text(errors="replace").strip()
                last = log.splitlines()[-1] if log else status
                raise params.AgentError(f"the supervisor of task {task_dir.name} died: {last}")
        pending = still
        if pending:
            time.sleep(0.005)


def _recorded(task_dir: Path) -> bool:
    """The supervisor started the task (pid.json) or recorded why it could not (exit.json)."""
    return (task_dir / "pid.json").exists() or (task_dir / "exit.json").exists()


def _ended(pid: int) -> str | None:
    """How the supervisor `pid` (our child) ended; None while it runs."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "it ended"
    if not done:
        return None
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


class _Stop:
    """Stops one task: SIGTERM to its group, SIGKILL at the deadline, until exit.json exists."""

    def __init__(self, task_dir: Path, grace: float, now: float) -> None:
        self.task_dir, self.grace = task_dir, grace
        self.begun_at = now
        self.kill_at: float | None = None
        self.last_signal: int | None = None
        self.pids: dict[str, Any] | None = None
        self.done = False

    def step(self, now: float) -> None:
        state, pids, _ = procs.task_state(self.task_dir)
        if state == protocol.STATE_STARTING and self._may_still_start(now):
            return  # a start op is about to write pid.json
        if state == protocol.STATE_RUNNING and self.pids is None:
            self._begin(pids, now)
        elif state == protocol.STATE_RUNNING and self.kill_at is not None and now >= self.kill_at:
            self._signal(signal.SIGKILL)
            self.kill_at = None
        elif state == protocol.STATE_LOST and self.last_signal is not None:
            # We signalled it and no supervisor is left to write the record: write it ourselves
            # (into the supervisor's reserved blocks on a full disk; never failing the stop).
            with contextlib.suppress(OSError):
                exits.write(self.task_dir, procs.stopped_record(self.last_signal))
            self.done = True
        elif state != protocol.STATE_RUNNING:
            self.done = True

    def _may_still_start(self, now: float) -> bool:
        try:
            written = (self.task_dir / "spec.json").stat().st_mtime
        except OSError:
            return False  # no spec: nothing will ever start here
        return now - max(written, self.begun_at) < START_TIMEOUT

    def _begin(self, pids: dict[str, Any], now: float) -> None:
        self.pids = pids
        try:
            marker = {"requested": time.time(), "grace": self.grace}
            layout.write_json(self.task_dir / "stop", marker)
        except OSError:
            # A full disk must not keep a task running: SIGTERM tells its supervisor instead
            # (it records the stop and keeps the SIGKILL deadline, as the marker would).
            procs.signal_process(pids.get("supervisor"), pids.get("supervisor_ticks"))
        self._signal(signal.SIGTERM)
        self.kill_at = now + self.grace

    def _signal(self, sig: int) -> None:
        assert self.pids is not None
        if procs.signal_group(self.pids.get("pgid"), self.pids.get("start_ticks"), sig):
            self.last_signal = sig
        elif self.last_signal is None:
            self.last_signal = sig  # already gone: a stop still ended it as far as anyone knows


class _SetupStop:
    """Stops a setup command that is still running: same SIGTERM-then-SIGKILL as a task."""

    def __init__(self, record: dict[str, Any], grace: float, now: float) -> None:
        self.pgid, self.ticks = record.get("pgid"), record.get("start_ticks")
        self.kill_at: float | None = now + grace
        self.done = not procs.signal_group(self.pgid, self.ticks, signal.SIGTERM)

    def step(self, now: float) -> None:
        if not procs.group_alive(self.pgid, self.ticks):
            self.done = True
        elif self.kill_at is not None and now >= self.kill_at:
            procs.signal_group(self.pgid, self.ticks, signal.SIGKILL)
            self.kill_at = None


def _mark_stopped(run_dir: Path, marker: dict[str, Any]) -> None:
    """The run's stop marker; on a full disk an empty one (a name, no block), or none: the
    stop itself must go on whatever the disk says."""
    try:
        layout.write_json(run_dir / "stop", marker)
    except OSError:
        with contextlib.suppress(OSError):
            os.close(os.open(run_dir / "stop", os.O_WRONLY | os.O_CREAT, 0o600))


def op_stop(req: dict[str, Any]) -> protocol.StopReply:
    run_dir = layout.run_path(req, must_exist=False)
    grace = grace_param(req)
    names = params.param(req, "tasks", list, None)
    if not (run_dir / "run.json").is_file():
        # Before the code reached this host (`down`, or Ctrl-C, while `up` pushed): nothing to
        # stop, but its `up` may still push and start. The stop marker, in a folder of its own,
        # makes this host refuse every later reservation, code and start of the run.
        if names:
            raise params.AgentError(
                f"there is no run {run_dir.name!r} on this host", protocol.FAIL_NO_RUN
            )
        layout.make_private_dir(run_dir)
        with layout.run_lock(run_dir):
            if not layout.run_stopped(run_dir):
                _mark_stopped(run_dir, {"requested": time.time(), "grace": grace, "early": True})
        reservations.release(layout.workdir_path(req), run_dir.name)
        daemon.stop_stand_ins(req, run_dir.name)
        return {"tasks": [], "escaped": []}
    now = time.time()
    stops: list[_Stop | _SetupStop] = []
    if names is None:
        import kept  # a kept run's keeper and warden here end first: no restart races this

        kept.stop_all(layout.workdir_path(req), run_dir.name)
        with layout.run_lock(run_dir):  # no start is half-way through creating tasks now
            if not layout.run_stopped(run_dir):
                _mark_stopped(run_dir, {"requested": now, "grace": grace})
            dirs = layout.task_dirs(run_dir)
            setup = layout.read_json(run_dir / "setup.json")
            if isinstance(setup, dict):
                stops.append(_SetupStop(setup, grace, now))
    else:
        dirs = [run_dir / "tasks" / params.task_dirname(n) for n in names]
        for name, path in zip(names, dirs):
            if not path.is_dir():
                raise params.AgentError(f"run {run_dir.name} has no task {name}")
    stops += [_Stop(d, grace, now) for d in dirs]
    deadline = now + grace + STOP_SLACK
    while True:
        now = time.time()
        for stop in stops:
            if not stop.done:
                stop.step(now)
        if all(s.done for s in stops) or now > deadline + START_TIMEOUT:
            break
        time.sleep(POLL)
    reply: protocol.StopReply = {"tasks": [procs.task_status(d) for d in dirs]}
    # The whole run, or an attempt of it (`escaped`: every task stopped before a whole-job
    # restart): also what left the task groups, so nothing of one attempt lives into the next.
    if names is None or params.param(req, "escaped", bool, False):
        supervisors, groups = strays.run_groups(run_dir)
        reply["escaped"] = strays.stop(run_dir.name, grace, supervisors, groups)
        try:
            remove_containers(run_dir)
        except containers.ContainerError as exc:
            raise params.AgentError(str(exc)) from None
    if names is None:  # and its reserved ports, and a push's or check's server still serving
        workdir = layout.workdir_path(req)
        reservations.release(workdir, run_dir.name)
        for kind in ("peers", "netcheck"):
            daemon.stop(layout.host_dir(workdir) / kind / f"{run_dir.name}.json")
    return reply
