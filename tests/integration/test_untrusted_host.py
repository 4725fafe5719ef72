"""A compromised host, on the lab: its agent patched as an attacker with the host's login would
patch it, aiming at canary files in the test's own folder (issue 39, items 1-5).

Each test runs a short job on one lab host in a workdir of its own (so the patched agent serves
no other test), edits the installed agent under `WORKDIR/agent/<id>/` over plain ssh
(tests/support/hostile.py), then runs the verb a user would run next. Whatever the host
answers, nothing outside the run's folders on this machine may change, and no control character
may reach the terminal.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.support.hostile import Hostile, files_under, hostile_run, no_control_characters

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

CANARY = b"the user's own file\n"


@pytest.fixture
def hostile(lab: Lab, tmp_path: Path) -> Iterator[Hostile]:
    with hostile_run(lab, tmp_path, TASK) as run:
        yield run


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
                    '        found[name] = {"files": files, "refused": refused, "unread": unread}',
                    '        found["../../canary-dir"] = {"files": files, "refused": refused, '
                    '"unread": unread}',
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
    # the run's own record beside its logs (docs/metrics.md): nothing named by the host
    own = {"facts.json", "outcome.json", "journal.jsonl", "metric_offsets.json", "usage", "metrics"}
    assert {p.name for p in archive.glob("*")} <= {"archive.json", "worker-0.log", *own}
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
                    "    root = layout.runs_dir(workdir)\n    hosts_of",
                    f"    raise params.AgentError('{said}')\n"
                    "    root = layout.runs_dir(workdir)\n    hosts_of",
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
