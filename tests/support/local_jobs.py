"""A job of one worker (or several on one host) on this machine (`transport = "local"`) for tests
that run the real CLI and agent without the lab, and the state folder such a test keeps its run
records in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.helpers import free_port


def local_job(tmp: Path, command: str, job: str = "", tasks: int = 1) -> Path:
    """An inventory of one worker (or `tasks` workers, sharing the host's one code directory as
    tasks of one host do) on this machine running `command` in its code directory."""
    (tmp / "code").mkdir(exist_ok=True)
    path = tmp / "inv.toml"
    path.write_text(
        f'[job]\nname = "pulls"\ncode = "code"\ncommand = {json.dumps(command)}\n'
        f'workdir = "{tmp}/wd"\npython = "{sys.executable}"\nport = {free_port(tasks)}\n'
        f"require_tensorflow = false\nstop_grace = 1\n{job}\n"
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        f'tasks = [{{ role = "worker", count = {tasks} }}]\n'
    )
    return path


def run_id_of(out: str) -> str:
    return next(w for w in out.split() if w.startswith("pulls-")).rstrip(")")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"
