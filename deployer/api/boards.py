"""`tfdeploy tensorboard RUN`: what a run wrote, in a TensorBoard on this machine (docs/profile.md).

TensorBoard runs here, from the controller's own environment (the `tensorboard` extra: the
TensorBoard and profile-plugin packages; TensorFlow 2.21 no longer brings TensorBoard), over
the run's local folder `<to>/<run>/`: the events of `[job.tensorboard] logdir`, pulled from the
tasks' hosts like `tfdeploy pull` into `<role>-<index>/<logdir>/`, and every profile
`tfdeploy profile` brought home under `profile/`. While the run goes on, new event files are
pulled every SYNC_EVERY_S seconds (only contents not here yet travel); once it has ended, one
last pull, and TensorBoard serves until Ctrl-C. Nothing runs on the hosts but the pulls.

    with tensorboard(run_id) as board:
        print(board.url)
        board.serve(say=print)  # until Ctrl-C
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from deployer.api.actions import Say, discovered, newest_run
from deployer.core.errors import TfdeployError, UsageError
from deployer.hosts.fleet import Fleet
from deployer.results.pull import pull
from deployer.results.runs import Target, resolve, survey_runs

SYNC_EVERY_S = 10.0
START_TIMEOUT_S = 120.0  # TensorBoard's own start: its plugins load for seconds
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
INSTALL_HINT = "pip install 'tfdeploy-cluster[tensorboard]' (TensorBoard and its profile plugin)"


class Board:
    """A TensorBoard on 127.0.0.1:`port` over the run's folder, kept in step with its hosts."""

    def __init__(
        self,
        fleet: Fleet,
        target: Target,
        folder: Path,
        patterns: list[str],
        process: subprocess.Popen[bytes],
        port: int,
    ) -> None:
        assert target.run_id is not None
        self._fleet, self._target, self._patterns, self._process = fleet, target, patterns, process
        self.run_id, self.folder, self.port = target.run_id, folder, port
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def sync(self) -> tuple[int, bool]:
        """One pull of the run's event files: (files that arrived, whether the run still runs).
        A run without `[job.tensorboard] logdir` has none to pull."""
        survey = survey_runs(self._fleet, self._target)
        active = any(r.active for r in survey.runs)
        if not self._patterns:
            return 0, active
        pulled = pull(self._fleet, self.run_id, self._patterns, self.folder.parent)
        return pulled.fetched_files, active

    def serve(self, say: Say) -> None:
        """Pulls new events while the run goes on, then serves until Ctrl-C or TensorBoard
        ends (raised as UsageError with its last words)."""
        active = True
        while self._process.poll() is None:
            if active:
                try:
                    arrived, active = self.sync()
                except TfdeployError as exc:  # a host gone: what is here is still served
                    say(f"could not pull the run's events now: {exc}")
                else:
                    if arrived:
                        say(f"pulled {arrived} event file(s) of run {self.run_id}")
                    if not active:
                        say(f"run {self.run_id} has ended: its events are all here")
            if self._stop.wait(SYNC_EVERY_S if active else 1.0):
                return
        raise UsageError(f"TensorBoard ended (exit {self._process.returncode})")

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


@contextlib.contextmanager
def tensorboard(
    run_id: str,
    *,
    inventory: str | None = None,
    port: int = 6006,
    to: str | os.PathLike[str] = "tfdeploy-runs",
    say: Say | None = None,
) -> Iterator[Board]:
    """A TensorBoard here over the run's folder `to/<run>/` (its events pulled from the hosts,
    its profiles), on 127.0.0.1:`port` (0: a free one). Raises UsageError when TensorBoard is
    not installed here, the port is taken, or no host has the run."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("TensorBoard is not installed here", hint=INSTALL_HINT)
    port = _free_port(port)
    target = discovered(newest_run(resolve(run_id, inventory), "tensorboard", say or _nothing))
    assert target.run_id is not None
    folder = Path(to) / target.run_id
    folder.mkdir(parents=True, exist_ok=True)
    board_table = target.inventory.job.tensorboard
    patterns = [_pattern(board_table.logdir)] if board_table is not None else []
    with Fleet(target.hosts) as fleet, _started(folder, port) as process:
        board = Board(fleet, target, folder, patterns, process, port)
        try:
            yield board
        finally:
            board.close()


def _pattern(logdir: str) -> str:
    return f"{logdir.rstrip('/')}/**"


@contextlib.contextmanager
def _started(folder: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """TensorBoard over `folder`, answering on the port (else UsageError with its words)."""
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(folder)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "5"]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
        try:
            _wait_answering(process, port, log)
            yield process
        finally:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_answering(process: subprocess.Popen[bytes], port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UsageError(f"TensorBoard did not start: {_last_words(log)}", hint=INSTALL_HINT)
        with (
            contextlib.suppress(OSError),
            _DIRECT.open(f"http://127.0.0.1:{port}/", timeout=2),
        ):
            return
        time.sleep(0.5)
    raise UsageError(f"TensorBoard did not answer on port {port} in {START_TIMEOUT_S:g} s")


def _last_words(log: IO[bytes]) -> str:
    log.seek(0)
    lines = log.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "no output"


def _free_port(port: int) -> int:
    """`port`, checked free on 127.0.0.1 (0: any free one)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise UsageError(
                f"port {port} is in use on this machine", hint="--port N, or --port 0 for any"
            ) from None
        return int(probe.getsockname()[1])


def _nothing(_: str) -> None:
    pass
