"""The host side stays stdlib-only: hosts have a bare interpreter, nothing pip-installed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remote import protocol
from tests.support.local_pythons import old_pythons

REMOTE = Path(__file__).resolve().parents[2] / "remote"
# tfserver.py imports TensorFlow on purpose (inside its main), and only it may.
MODULES = sorted(p for p in REMOTE.glob("*.py") if p.name != "tfserver.py")
# "remote": protocol.py names the shapes from remote.shapes on the control side (its one import
# of the package; a host imports shapes.py beside it).
SIBLINGS = {p.stem for p in REMOTE.glob("*.py")} | {"remote"}


def imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; hosts run these as scripts"
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_only_the_stdlib_and_siblings(path: Path) -> None:
    foreign = imported_names(path) - set(sys.stdlib_module_names) - SIBLINGS - {"__future__"}
    assert not foreign, f"{path.name} imports non-stdlib modules: {sorted(foreign)}"


def test_modules_import_as_top_level_scripts_do_on_hosts() -> None:
    # -I: no site-packages, no PYTHON* env, no cwd on sys.path: just the agent's directory.
    names = ", ".join(p.stem for p in MODULES if p.stem != "__init__")
    code = f"import sys; sys.path.insert(0, {str(REMOTE)!r}); import {names}"
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=30)


def agent_call(python: str, workdir: Path, op: str, **params: Any) -> dict[str, Any]:
    request = {"v": protocol.PROTOCOL_VERSION, "op": op, "workdir": str(workdir), **params}
    proc = subprocess.run(
        [python, "-S", str(REMOTE / "agent.py")],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
    reply: dict[str, Any] = json.loads(proc.stdout)
    assert reply["ok"], reply
    return reply


@pytest.mark.skipif(not old_pythons(), reason="no Python 3.8 or 3.9 on this machine")
@pytest.mark.parametrize("python", old_pythons() or ["none"])
def test_the_agent_runs_a_task_on_an_old_python(python: str, tmp_path: Path) -> None:
    """vermin checks the syntax; this proves the calls: start in a group, supervise, stop."""
    wd = tmp_path / "wd"
    assert agent_call(python, wd, "hello", ports=[])["python"].startswith("3.")
    agent_call(python, wd, "materialize", run_id="r1", job="j", files=[], lease_seconds=None)
    agent_call(python, wd, "setup", run_id="r1", fingerprint="f", commands=["echo set > up.txt"])
    [task] = agent_call(
        python, wd, "start", run_id="r1", grace=1, tasks=[{"name": "w:0", "command": "sleep 30"}]
    )["tasks"]
    assert task["state"] == "running" and os.getpgid(task["pid"]) == task["pid"]
    [done] = agent_call(python, wd, "stop", run_id="r1", tasks=None, grace=1)["tasks"]
    assert (done["state"], done["reason"], done["signal"]) == ("exited", "stopped", 15)
    assert [p.read_text() for p in wd.glob("hosts/*/runs/r1/code/up.txt")] == ["set\n"]
