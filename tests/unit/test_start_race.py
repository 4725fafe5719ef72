"""The start op against a supervisor that finishes while it is being looked at.

The interleaving is forced, not hoped for: the start op runs in a Python process of its own
with two of its steps wrapped. The supervisor (a real fork of that process, running a real
`true`) waits until the start op has looked for its records and found none; the start op then
waits until the supervisor has written both records and exited before it asks `waitpid`. That
is the window a 0.3 s pause between the two steps opened every time.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.agent import AGENT, PYTHON, new_run, runs_dir

pytestmark = pytest.mark.timeout(30)

SCRIPT = """
import json, os, sys, time
from pathlib import Path
import params, supervisor, taskops

go = Path(sys.argv[1])
real_run, real_ended = supervisor._Supervisor.run, taskops._ended

def gated_run(self):  # in the forked supervisor: start only once the start op has looked
    while not go.exists():
        time.sleep(0.002)
    real_run(self)

def late_ended(pid):  # in the start op: ask waitpid only once the supervisor is gone
    go.touch()
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return real_ended(pid)

supervisor._Supervisor.run = gated_run
taskops._ended = late_ended
try:
    reply = {"ok": True, **taskops.op_start(json.loads(sys.argv[2]))}
except params.AgentError as exc:
    reply = {"ok": False, "error": str(exc)}
print(json.dumps(reply))
"""


def test_a_task_that_ends_between_the_look_and_waitpid_started(
    workdir: Path, tmp_path: Path
) -> None:
    new_run(workdir)
    request = {
        "workdir": str(workdir),
        "run_id": "r1",
        "grace": 1,
        "tasks": [{"name": "worker:0", "command": "true"}],
    }
    go = tmp_path / "go"
    proc = subprocess.run(
        [PYTHON, "-c", SCRIPT, str(go), json.dumps(request)],
        cwd=AGENT.parent,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert go.exists(), "the start op never asked waitpid: the window was not opened"
    reply = json.loads(proc.stdout.splitlines()[-1])
    assert reply["ok"] is True, reply
    [task] = reply["tasks"]
    assert task["name"] == "worker:0" and task["state"] == "exited", task
    assert task["exit_code"] == 0, task
    exit_record = json.loads((runs_dir(workdir) / "r1/tasks/worker-0/exit.json").read_text())
    assert exit_record["code"] == 0 and exit_record["reason"] == "exited"
