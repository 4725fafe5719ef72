"""Per-task supervisor: runs the task's process group, enforces stop and lease, records the exit."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bytecode
import containers
import daemon
import exits
import hostid
import interpreters
import layout
import params
import procs
import protocol
import strays
import taskmetrics
import venvs

if TYPE_CHECKING:
    import spot

TICK = 0.25  # how often the stop marker is looked at; stop ops signal the group themselves
LEASE_CHECK = 1.0
STRAGGLER_WAIT = 2.0
FILL_AFTER_S = 30.0  # a task that reports no step: its imports are surely done by then


class _Supervisor:
    def __init__(self, run_dir: Path, task_dir: Path) -> None:
        self.run_dir, self.task_dir = run_dir, task_dir
        spec = layout.read_json(task_dir / "spec.json")
        if not isinstance(spec, dict):
            raise SystemExit(f"supervisor: no readable spec.json in {task_dir}")
        self.spec: dict[str, Any] = spec
        self.grace = float(spec.get("grace") or 10.0)
        self.terminated = False
        self.reason: str | None = None
        self.kill_at: float | None = None
        self.next_lease_check = time.monotonic() + LEASE_CHECK
        self.pgid = 0
        self.ticks: int | None = None
        self.watcher: spot.Watch | None = None
        self.notice: dict[str, str] | None = None  # exit.json's "notice": action, time
        self.container: dict[str, Any] | None = spec.get("container")
        self.fill: _Fill | None = None if self.container else _Fill.of(spec, task_dir)

    def run(self) -> None:
        proc = self._spawn()
        if proc is None:
            return
        self._watch_spot()
        returncode = self._watch(proc)
        if self.fill is not None:
            self.fill.stop()
        if self.container is not None and returncode >= 0:
            returncode = containers.returncode(returncode)  # 128+N from the client: signal N
        ended = time.time()
        if self.watcher is not None:
            self.watcher.stop()
        if self.reason is None and (self.terminated or (self.task_dir / "stop").exists()):
            self.reason = protocol.REASON_STOPPED
        self._read_warning()
        self._reap_stragglers()
        record = procs.exit_record(returncode, self.reason, ended)
        if self.reason == protocol.REASON_LEASE_EXPIRED:  # no controller will send a whole-run stop
            record["escaped"] = self._stop_strays()
            self._remove_run_containers()
        if self.notice is not None:
            record["notice"] = self.notice
        exits.write(self.task_dir, record)
        self._remove_container()

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        exits.reserve(self.task_dir)  # while the disk has room: the task may fill it
        (self.task_dir / layout.WARNED).unlink(missing_ok=True)  # an earlier attempt's warning
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        log_fd = os.open(self.task_dir / "output.log", flags, 0o600)
        # The host identity lets a whole-run stop tell this host's strays from another host's
        # of the same run, should both be visible (hosts that share a pid namespace).
        env = {**os.environ, **self.spec.get("env", {}), protocol.HOST_ID_ENV: hostid.identity()}
        env = interpreters.task_env(self.spec.get("venv"), self.spec.get("python"), env)
        env = taskmetrics.task_env(self.task_dir, env)
        try:
            if self.spec.get("cpus"):
                # Pinned before the fork, so the task inherits it from its first instruction
                # (and every thread it starts): no window where TF sizes pools for all CPUs.
                os.sched_setaffinity(0, self.spec["cpus"])
            cwd = layout.task_cwd(self.run_dir, self.spec.get("cwd"))
            if self.container is not None:
                argv, env = self._container_argv(cwd)
                self._remove_container()  # an earlier attempt's, should its removal be late
            else:
                argv = ["/bin/sh", "-c", _command(self.spec["command"], env.get("PATH"))]
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # its own process group (and session), no tty
            )
        except (OSError, params.AgentError) as exc:
            # Nothing ran; say why in the task's own log, where the user will look.
            os.write(log_fd, f"tfdeploy: cannot start the task: {exc}\n".encode())
            exits.write(self.task_dir, procs.exit_record(127, None, time.time()))
            return None
        finally:
            os.close(log_fd)
        self.pgid, self.ticks = proc.pid, procs.start_ticks(proc.pid)
        pids = {
            "supervisor": os.getpid(),
            "supervisor_ticks": procs.start_ticks(os.getpid()),
            "pid": proc.pid,
            "pgid": proc.pid,
            "start_ticks": self.ticks,
            "started": time.time(),
        }
        layout.write_json(self.task_dir / "pid.json", pids)
        return proc

    def _container_argv(self, cwd: Path) -> tuple[list[str], dict[str, str]]:
        """`RUNTIME run ...` in place of the task's shell (containers.run_argv): the task's own
        environment only (the host's PATH and HOME mean nothing in the image), the workdir
        (the run's code and task directories) and the job's mounts at their own paths. With the
        environment its client runs with: the values travel there, never on its command line."""
        box = self.container
        assert box is not None
        workdir = self.run_dir.parents[3]  # WORKDIR/hosts/<id>/runs/<run>
        mounts = [str(workdir), *box.get("mounts", [])]
        if not str(cwd).startswith(str(workdir) + os.sep):
            mounts.append(str(cwd))  # an absolute cwd of the task's own
        env = {**self.spec.get("env", {}), protocol.HOST_ID_ENV: hostid.identity()}
        env = taskmetrics.task_env(self.task_dir, env)
        gpus = box.get("gpus", [])
        argv = containers.run_argv(
            box["runtime"],
            image=box["image"],
            run_id=self.run_dir.name,
            task=self.spec["name"],
            command=self.spec["command"],
            env=env,
            mounts=list(dict.fromkeys(mounts)),
            cwd=str(cwd),
            uid=os.getuid(),
            gid=os.getgid(),
            rootless=bool(box.get("rootless")),
            gpus=gpus,
        )
        return argv, containers.client_env(os.environ, env, gpus)

    def _remove_container(self) -> None:
        """The task's container goes once its exit is recorded; after a SIGKILL of the client
        it still runs under conmon, and `rm -f` ends it."""
        if self.container is not None:
            containers.remove(
                self.container["runtime"],
                containers.container_name(self.run_dir.name, self.spec["name"]),
            )

    def _remove_run_containers(self) -> None:
        """A lease that expired: no controller will send the whole-run stop that removes the
        run's containers, so the first supervisor to see it does."""
        if self.container is None:
            return
        with contextlib.suppress(containers.ContainerError):
            containers.remove_run(self.container["runtime"], self.run_dir.name)

    def _watch(self, proc: subprocess.Popen[bytes]) -> int:
        waker = _Waker(proc.pid)
        while True:
            waker.wait(TICK)
            returncode = proc.poll()
            if returncode is not None:
                return returncode
            self._check_stop()
            if self.fill is not None and self.reason is None:
                self.fill.check()

    def _watch_spot(self) -> None:
        """Polls IMDS for a spot interruption notice when the task's spec asks for it.

        Imported here: supervisors of other tasks start without spot's imports (~5 ms).
        """
        config = self.spec.get("spot")
        if not isinstance(config, dict):
            return
        import spot

        self.watcher = spot.Watch(
            str(config.get("url") or spot.DEFAULT_URL),
            float(config.get("interval") or spot.DEFAULT_INTERVAL),
        )
        self.watcher.start()

    def _check_notice(self) -> None:
        """A notice stops the task now; a stop or lease expiry already under way wins instead."""
        if self.watcher is None:
            return
        if self.reason is not None:
            self.watcher.stop()  # the task ends anyway: the notice would change nothing
            return
        if self.watcher.notice is not None:
            self._preempt(self.watcher.notice)

    def _preempt(self, notice: spot.Notice) -> None:
        """SIGTERM at once, so the task can checkpoint; SIGKILL `margin` seconds before the
        instance goes, so the exit is recorded (and the log flushed) while it still exists."""
        self.notice = {"action": notice.action, "time": notice.time}
        margin = float((self.spec.get("spot") or {}).get("margin") or 0.0)
        grace = max(0.0, notice.at - margin - time.time())
        self._say(
            f"tfdeploy: spot interruption notice ({notice.action} at {notice.time or '?'}): "
            f"SIGTERM now, SIGKILL in {grace:.0f} s"
        )
        self._begin_stop(protocol.REASON_PREEMPTED, grace)

    def _read_warning(self) -> None:
        """A scheduler's warning passed to the task (relay.py's `warned` marker) makes its end
        `preempted`, whatever its exit code: the allocation is ending, not the work done. A
        stop of tfdeploy's or a spot notice already under way keeps its own reason."""
        warned = layout.read_json(self.task_dir / layout.WARNED)
        if not isinstance(warned, dict) or self.notice is not None:
            return
        self.notice = {"action": protocol.NOTICE_TIME_LIMIT, "time": _utc(warned.get("at"))}
        if self.reason is None:
            self.reason = protocol.REASON_PREEMPTED
            said = str(warned.get("signal"))[:16]
            self._say(f"tfdeploy: ended after the scheduler's warning ({said}): the time limit")

    def _say(self, line: str) -> None:
        """One line in the task's own log, where the user reads what happened to it."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        fd = os.open(self.task_dir / "output.log", flags, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def _check_stop(self) -> None:
        self._check_notice()
        now = time.time()
        if self.kill_at is not None:
            if now >= self.kill_at:
                procs.signal_group(self.pgid, self.ticks, signal.SIGKILL)
                self._remove_container()  # the SIGKILL ended the client, not the container
                self.kill_at = None
            return
        if self.reason is not None:
            return
        marker = layout.read_json(self.task_dir / "stop")
        if isinstance(marker, dict):
            # The stop op already sent SIGTERM; we only guarantee the SIGKILL deadline.
            self.reason = protocol.REASON_STOPPED
            self.kill_at = float(marker.get("requested", now)) + float(marker.get("grace", 0))
        elif self.terminated:
            self._begin_stop(protocol.REASON_STOPPED)
        elif time.monotonic() >= self.next_lease_check:
            self.next_lease_check = time.monotonic() + LEASE_CHECK
            if self._lease_expired(now):
                self._begin_stop(protocol.REASON_LEASE_EXPIRED)

    def _begin_stop(self, reason: str, grace: float | None = None) -> None:
        self.reason = reason
        procs.signal_group(self.pgid, self.ticks, signal.SIGTERM)
        self.kill_at = time.time() + (self.grace if grace is None else grace)

    def _lease_expired(self, now: float) -> bool:
        meta = layout.read_json(self.run_dir / "run.json")
        if not isinstance(meta, dict) or meta.get("detached") or meta.get("lease_seconds") is None:
            return False
        try:
            beat = (self.run_dir / "lease").stat().st_mtime
        except OSError:
            return True  # the run is being removed under us: nobody will renew it
        return now - beat > float(meta["lease_seconds"])

    def _stop_strays(self) -> list[protocol.EscapedShape]:
        """What of the run left its task group ends with the lease, as a whole-run stop would."""
        supervisors, groups = strays.run_groups(self.run_dir)
        groups.discard(self.pgid)  # ours is gone; the other tasks' supervisors stop theirs
        return strays.stop(self.run_dir.name, self.grace, supervisors, groups)

    def _reap_stragglers(self) -> None:
        """A task is its whole process group: members left behind by the leader end with it."""
        if not _members_alive(self.pgid):
            return
        if self.kill_at is None:
            _killpg_quiet(self.pgid, signal.SIGTERM)
            self.kill_at = time.time() + self.grace
        while _members_alive(self.pgid) and time.time() < self.kill_at:
            time.sleep(0.05)
        deadline = time.time() + STRAGGLER_WAIT
        while _members_alive(self.pgid) and time.time() < deadline:
            _killpg_quiet(self.pgid, signal.SIGKILL)
            time.sleep(0.05)


class _Fill:
    """Compiling the bytecode store from what the venv's tasks imported (bytecode.fill says
    why): at once in a venv an earlier run used (its imports are known), else once the task
    reported its first step (its imports are done) or ran FILL_AFTER_S without reporting; a
    child of the supervisor, stopped when the task ends."""

    def __init__(self, argv: list[str], metrics: Path, used_before: bool) -> None:
        self.argv, self.metrics = argv, metrics
        self.due = time.monotonic() + (0.0 if used_before else FILL_AFTER_S)
        self.proc: subprocess.Popen[bytes] | None = None
        self.done = False

    @classmethod
    def of(cls, spec: dict[str, Any], task_dir: Path) -> _Fill | None:
        """For a task in an environment tfdeploy built (its `.complete` names the Python)."""
        venv = spec.get("venv")
        if not isinstance(venv, str):
            return None
        built = layout.read_json(Path(venv) / venvs.COMPLETE)
        version = built.get("python") if isinstance(built, dict) else None
        if not isinstance(version, str):
            return None
        try:
            store = bytecode.store_dir(Path(venv).parent.parent, hostid.identity())
        except params.AgentError:
            return None  # no usable host identity: no store either (a speed-up only)
        argv = bytecode.fill_argv(Path(venv), version, store)
        try:
            runs = len(os.listdir(str(Path(venv) / venvs.USES)))  # a file per run, ours too
        except OSError:
            runs = 0
        return cls(argv, taskmetrics.metrics_path(task_dir), runs > 1)

    def check(self) -> None:
        if self.done:
            return
        if self.proc is not None:
            self.done = self.proc.poll() is not None
            return
        try:
            reported = os.stat(str(self.metrics)).st_size > 0
        except OSError:
            reported = False
        if not reported and time.monotonic() < self.due:
            return
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": os.environ.get("PATH", os.defpath)},
                close_fds=True,
            )
        except OSError:
            self.done = True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.done = True


def _members_alive(pgid: int) -> bool:
    # The leader is reaped by now and its pid stays unused while the group has members.
    return _killpg_quiet(pgid, 0) and bool(procs.live_members(pgid))


def _killpg_quiet(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A command made only of these characters is one simple command: no pipes, lists, redirections,
# expansions or globs, so `exec` in front of it changes nothing but the process tree.
_SIMPLE = re.compile(r"[A-Za-z0-9 _./:=,+@%-]+")


def _command(command: str, path: str | None) -> str:
    """`tfdeploy:server` names the built-in TF server that sits next to this agent.

    A simple command is exec'd by the shell, so the task's pid is the user's process itself: a
    `kill -9` of it is then recorded as signal 9, not as the shell's exit code 137.
    """
    if command.strip() == "tfdeploy:server":
        server = layout.AGENT_DIR / "tfserver.py"
        return f"exec {shlex.quote(sys.executable)} {shlex.quote(str(server))}"
    words = command.split()
    if not (_SIMPLE.fullmatch(command) and words and "=" not in words[0]):
        return command
    # Only programs: a shell builtin (exit, cd, ...) cannot be exec'd.
    if "/" in words[0] or shutil.which(words[0], path=path) is not None:
        return f"exec {command}"
    return command


class _Waker:
    """Sleeps until the task exits, a signal arrives or the timeout passes, without busy polling."""

    def __init__(self, pid: int) -> None:
        pidfd_open = getattr(os, "pidfd_open", None)  # Python 3.9+
        try:
            self.fds = [pidfd_open(pid)] if pidfd_open is not None else []
        except OSError:
            self.fds = []  # old kernel (or Python): fall back to ticking
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self.fds.append(read_end)
        self.wake = read_end

    def wait(self, timeout: float) -> None:
        ready, _, _ = select.select(self.fds, [], [], timeout)
        if self.wake in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake, 512)


COMM = b"tfd-supervisor"  # what ps -e and top show: its command line is the agent's


def fork(run_dir: Path, task_dir: Path, log_fd: int) -> int:
    """Forks this agent into the task's supervisor and returns its pid (the start op's child,
    so it can tell a supervisor that died from one still starting).

    A fork, not a new interpreter: the agent has imported everything a supervisor needs, and a
    fresh `python agent.py supervise` cost ~40 ms of host CPU per task before its first line.
    The child leaves the agent's session, holds none of its files (the run lock above all) and
    none of the SSH channel's pipes: stdin and stdout are /dev/null, stderr is `log_fd`.
    """
    sys.stdout.flush()  # nothing of the agent's replies may be written twice
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # pragma: no cover - runs in the forked process
        os.setsid()
        _own_files(log_fd)
        # The agent's objects stay as they are: a collected file object of the agent's would
        # close a descriptor number the supervisor has reused.
        gc.freeze()
        with contextlib.suppress(OSError):
            Path("/proc/self/comm").write_bytes(COMM)
        code = _supervise(run_dir, task_dir)
    except SystemExit as exc:  # _Supervisor's "no readable spec.json"
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback  # only a supervisor that failed pays for its imports

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _own_files(log_fd: int) -> None:
    daemon.quiet_stdio(log_fd)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _supervise(run_dir: Path, task_dir: Path) -> int:
    sup = _Supervisor(run_dir, task_dir)

    def on_term(signum: int, frame: object) -> None:
        sup.terminated = True

    signal.signal(signal.SIGTERM, on_term)
    # Handlers, not SIG_IGN: ignored dispositions would be inherited by the task across exec.
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    sup.run()
    return 0


def _utc(at: object) -> str:
    """A Unix time as IMDS writes its notice times (2026-12-02T19:30:00Z); "" when not one."""
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
