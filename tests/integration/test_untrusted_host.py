"""A compromised host, on the lab: its agent patched as an attacker with the host's login would
patch it, aiming at canary files in the test's own folder (issue 39, items 1-5).

Each test runs a short job on one lab host in a workdir of its own (so the patched agent serves
no other test), edits the installed agent under `WORKDIR/agent/<id>/` over plain ssh, then runs
the verb a user would run next. Whatever the host answers, nothing outside the run's folders on
this machine may change, and no control character may reach the terminal.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab]

# The task leaves a file to pull and prints C1 controls: CSI, OSC ... ST, DCS ... ST (item 4).
TASK = """\
import os
os.makedirs("out", exist_ok=True)
with open("out/tool", "w") as f:
    f.write("the task's own bytes\\n")
os.chmod("out/tool", 0o755)
print("before\\u009d0;PWNED-TITLE\\u009cafter \\u009b2J\\u0090dcs\\u009cend", flush=True)
"""

# Run on the host through ssh, as the attacker: the installed agent's sources stay as they are
# (every hello checks them against their content id and installs them again when they differ),
# and the patched code goes into their compiled files instead, stamped with the sources' mtime
# and size so that Python takes them. A host account's owner can always do this, or replace the
# interpreter: the check guards against damage, not against the host.
PATCH = """\
import glob, importlib.util, json, marshal, os, sys
edits = json.loads(sys.stdin.readline())
[home] = glob.glob(os.path.expanduser(edits.pop("@workdir")) + "/agent/*/")
for name, pairs in edits.items():
    path = os.path.join(home, name)
    text = open(path).read()
    for old, new in pairs:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    st = os.stat(path)
    head = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    head += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    head += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc = importlib.util.cache_from_source(path)
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    with open(pyc, "wb") as f:
        f.write(head + marshal.dumps(compile(text, path, "exec")))
"""

C0_C1_ESC = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
CANARY = b"the user's own file\n"


@dataclass
class Hostile:
    """One finished run on a lab host whose agent the test may patch."""

    lab: Lab
    host: str
    workdir: str
    inventory: Path
    state: Path
    run_id: str
    up_output: str

    def patch(self, edits: dict[str, list[tuple[str, str]]]) -> None:
        line = json.dumps({"@workdir": self.workdir, **edits})
        argv = self.lab.ssh_argv(self.host, self.lab.python, "-c", _quoted(PATCH))
        done = subprocess.run(argv, input=line + "\n", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def tfdeploy(self, *args: str) -> subprocess.CompletedProcess[str]:
        return tfdeploy(*args, state=self.state, timeout=120)


def _quoted(code: str) -> str:
    """`code` as one word of the remote shell's command line."""
    return "'" + code.replace("'", "'\\''") + "'"


@pytest.fixture
def hostile(lab: Lab, tmp_path: Path) -> Iterator[Hostile]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "task.py").write_text(TASK)
    host = lab.hosts[0].name
    workdir = f"~/.tfdeploy-hostile-{uuid.uuid4().hex[:8]}"
    inventory = lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}]],
        job={"name": "hostile", "code": str(code), "command": "python3 task.py", "stop_grace": 1},
        hosts=[lab.hosts[0]],
        per_host={host: {"workdir": workdir}},
    )
    state = tmp_path / "state"
    try:
        up = tfdeploy("up", str(inventory), state=state, check_rc=0, timeout=180)
        run_id = up.stdout.split("(run ")[1].split(")")[0]
        yield Hostile(lab, host, workdir, inventory, state, run_id, up.stdout + up.stderr)
    finally:
        subprocess.run(lab.ssh_argv(host, "rm", "-rf", workdir), timeout=60, check=False)


def files_under(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` (but `skip`) with its bytes and mode: what must not change."""
    found = {}
    for path in sorted(root.rglob("*")):
        if any(path == s or path.is_relative_to(s) for s in skip) or not path.is_file():
            continue
        found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode)
    return found


def no_control_characters(output: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in C0_C1_ESC.findall(output)})
    assert not bad, f"control characters reached the terminal: {bad}\n{output!r}"


def test_a_task_name_from_collect_cannot_aim_pull_outside_the_run(
    hostile: Hostile, tmp_path: Path
) -> None:
    """Item 1: the collect reply names the task `../../canary-dir`; pulled into `pulled/`, its
    landing folder was `pulled/<run-id>/../../canary-dir`: the canary beside `pulled/`."""
    canary = tmp_path / "canary-dir" / "out" / "tool"
    canary.parent.mkdir(parents=True)
    canary.write_bytes(CANARY)
    hostile.patch(
        {
            "results.py": [
                (
                    '        found[name] = {"files": files, "refused": refused}',
                    '        found["../../canary-dir"] = {"files": files, "refused": refused}',
                ),
                ('    name = params.param(req, "task", str)\n', '    name = "worker:0"\n'),
            ]
        }
    )
    before = files_under(tmp_path, skip=(hostile.state,))
    pulled = tmp_path / "pulled"
    result = hostile.tfdeploy("pull", hostile.run_id, "out/*", "--to", str(pulled))
    output = result.stdout + result.stderr
    assert canary.read_bytes() == CANARY
    assert files_under(tmp_path, skip=(hostile.state, pulled / hostile.run_id)) == before
    assert result.returncode == 3, output  # the host's fault: exit 3 names it
    assert f"{hostile.host}: its agent's collect reply is not valid" in output
    assert "'../../canary-dir' is not a task name (ROLE:INDEX)" in output
    assert "Traceback" not in output


def test_logs_sync_writes_no_file_a_host_names(hostile: Hostile, tmp_path: Path) -> None:
    """Item 2: the runs reply names the task `../../../canary`; the archive folder is
    `state/runs/<run-id>/`, so its file `../../../canary.log` was the canary in tmp_path."""
    canary = tmp_path / "canary.log"
    canary.write_bytes(CANARY)
    hostile.patch(
        {
            "agent.py": [
                (
                    '                "tasks": tasks,',
                    '                "tasks": [dict(t, name="../../../canary") for t in tasks],',
                ),
                (
                    '        path = run_dir / "tasks" / params.task_dirname(name) / "output.log"',
                    '        path = run_dir / "tasks" / params.task_dirname("worker:0")'
                    ' / "output.log"',
                ),
            ]
        }
    )
    before = files_under(tmp_path, skip=(hostile.state,))
    result = hostile.tfdeploy("logs", hostile.run_id, "--sync")
    output = result.stdout + result.stderr
    assert canary.read_bytes() == CANARY
    assert files_under(tmp_path, skip=(hostile.state,)) == before
    runs = hostile.state / "runs"
    assert {p.name for p in runs.iterdir()} <= {hostile.run_id, f"{hostile.run_id}.json"}
    archive = runs / hostile.run_id
    assert {p.name for p in archive.glob("*")} <= {"archive.json", "worker-0.log"}
    assert result.returncode == 3, output
    assert "its agent's runs reply is not valid" in output
    assert "'../../../canary' is not a task name" in output
    assert "Traceback" not in output


def test_pull_gives_no_file_the_setuid_bit_a_host_asks_for(
    hostile: Hostile, tmp_path: Path
) -> None:
    """Item 3: the host lists out/tool with setuid and setgid (0o6755); as root, the pulled
    file kept them."""
    hostile.patch(
        {
            "results.py": [
                (
                    "info.st_size, info.st_mode & 0o777, digest",
                    "info.st_size, info.st_mode & 0o777 | 0o6000, digest",
                )
            ]
        }
    )
    pulled = tmp_path / "pulled"
    result = hostile.tfdeploy("pull", hostile.run_id, "out/*", "--to", str(pulled))
    assert result.returncode == 0, result.stdout + result.stderr
    tool = pulled / hostile.run_id / "worker-0" / "out" / "tool"
    assert tool.read_bytes() == b"the task's own bytes\n"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755


def test_host_error_texts_reach_the_terminal_cleaned(hostile: Hostile) -> None:
    """Item 5: an error text with OSC 52 (writes the user's clipboard) and CSI 2J (clears the
    screen) went to the terminal raw through `tfdeploy status`."""
    said = "\x1b]52;c;UFdORUQ=\x1b\\\\the host says no\x1b[2J\\u009b2J"
    hostile.patch(
        {
            "agent.py": [
                (
                    "    root = layout.runs_dir(layout.workdir_path(req))\n    hosts_of",
                    f"    raise params.AgentError('{said}')\n"
                    "    root = layout.runs_dir(layout.workdir_path(req))\n    hosts_of",
                )
            ]
        }
    )
    result = hostile.tfdeploy("status", str(hostile.inventory))
    output = result.stdout + result.stderr
    assert "the host says no" in output, output
    no_control_characters(output)
    assert "UFdORUQ" not in output  # the clipboard's payload went with its sequence
    assert "Traceback" not in output


def test_c1_controls_a_task_prints_are_cleaned_in_up_and_logs(hostile: Hostile) -> None:
    """Item 4: any task (no patch needed) printed U+009D ... U+009C, and it arrived intact."""
    logs = hostile.tfdeploy("logs", hostile.run_id)
    for output in (hostile.up_output, logs.stdout + logs.stderr):
        assert re.search(r"worker:0@\S+\s+\| beforeafter end$", output, re.M), output
        no_control_characters(output)
