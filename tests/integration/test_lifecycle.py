"""`tfdeploy up/down/status/logs` against the lab's real sshd hosts.

Their subject is tfdeploy's lifecycle: the MWMS-, PSS-shaped and failing jobs run the TF-shaped
stand-in (tests/support/standin.py; the real TensorFlow runs are tests/integration/
test_seed_programs.py); the TF1 how-to's program runs for real, flags from placeholders.

Every test runs the real CLI as a subprocess (as a user would) and, through `clean_lab`, checks
that no task process and no listening TF port is left on any lab host afterwards.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support import standin
from tests.support.lab_cli import EXAMPLES, TF_ENV, accuracies, tfdeploy
from tests.support.sizes import sizes_sent

pytestmark = pytest.mark.lab


def banners(output: str) -> dict[str, dict[str, Any]]:
    """The TF_CONFIG each task printed at start: what it really received, not the plan."""
    out = {}
    for label, tf_config, cuda in re.findall(
        r"^(\S+@\S+)\s+\| tfdeploy-env TF_CONFIG=(\{.*\}) CUDA_VISIBLE_DEVICES=(\S*) ",
        output,
        re.M,
    ):
        out[label] = {"tf_config": json.loads(tf_config), "cuda": cuda}
    return out


# The env banner of examples/digits (common.print_env_banner): what the task received. It then
# runs the rest of its command line, the stand-in, in its place.
BANNER = r"""
import os, sys
print("tfdeploy-env TF_CONFIG=" + os.environ.get("TF_CONFIG", "")
      + " CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
      + " TFDEPLOY_TASK=" + os.environ.get("TFDEPLOY_TASK", "<unset>"), flush=True)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def standin_job(lab: Lab, tmp_path: Path, args: str) -> tuple[Path, str]:
    """A code folder with the TF-shaped stand-in (tests/support/standin.py), and the command that
    runs it with `args` after the env banner: no TensorFlow, the subject is tfdeploy's lifecycle
    (issue 61)."""
    code = tmp_path / "code"
    standin.write(code)
    (code / "banner.py").write_text(BANNER)
    return code, f"{lab.python} banner.py {standin.NAME} {args}"


def test_mwms_on_three_hosts_trains_and_leaves_nothing(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """MWMS-shaped: three workers that dial each other first (the real MWMS run is
    test_seed_programs' `test_mwms_script_in_every_role_with_an_evaluator`)."""
    lab = clean_lab
    code, command = standin_job(lab, tmp_path, "5 --peers")
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 3, code=code, job={"name": "mwms", "command": command}
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    out = result.stdout
    h = [host.name for host in lab.hosts[:3]]
    for i in range(3):
        label = f"worker:{i}@{h[i]}"
        others = " ".join(f"worker:{j}" for j in range(3) if j != i)
        assert re.search(rf"^{label}\s+\| worker {i} reached {others}$", out, re.M), out
        assert re.search(rf"^{label}\s+\| worker {i} done at step 5$", out, re.M), out
    workers = [f"{host.address}:{lab.tf_port(host)}" for host in lab.hosts[:3]]
    for i in range(3):
        got = banners(out)[f"worker:{i}@{h[i]}"]
        assert got["tf_config"] == {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": i},
        }
        assert got["cuda"] == ""


def test_parameter_server_job_across_hosts(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """PSS-shaped: the chief, the workers and the ps dial each other; the ps serves until
    tfdeploy stops it. (The real PSS run, workers on `tfdeploy:server` stopped the same way, is
    test_seed_programs' `test_pss_script_in_every_role_with_an_evaluator`.)"""
    lab = clean_lab
    code, command = standin_job(lab, tmp_path, "5 --peers")
    inventory = lab_inventory(
        [[{"role": "chief"}], [{"role": "worker"}], [{"role": "worker"}, {"role": "ps"}]],
        code=code,
        job={
            "name": "pss",
            "command": command,
            "role_commands": {"ps": command},
            "stop_grace": 3,
        },
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    out = result.stdout
    h = [host.name for host in lab.hosts[:3]]
    chief = f"chief:0@{h[0]}"
    assert re.search(rf"^{chief}\s+\| chief 0 reached ps:0 worker:0 worker:1$", out, re.M), out
    assert re.search(rf"^{chief}\s+\| chief 0 done at step 5$", out, re.M), out
    server = f"ps:0@{h[2]}"
    assert re.search(rf"^{re.escape(server)}\s+\| ps 0 serving$", out, re.M), out
    assert re.search(rf"{re.escape(server)} pid \d+ exited \(stopped by tfdeploy\)", out), out
    assert "job succeeded: chief:0, worker:0 and worker:1 exited 0" in " ".join(out.split())


@pytest.mark.starts_tf
@pytest.mark.slow
def test_tf1_style_script_gets_its_flags_from_placeholders(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    command = (
        f"{lab.python} tf1_style.py --job_name={{task_type}} --task_index={{task_index}} "
        "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts}"
    )
    inventory = lab_inventory(
        [[{"role": "ps"}], [{"role": "worker"}], [{"role": "worker"}]],
        code=EXAMPLES,
        job={
            "name": "tf1",
            "command": command,
            "role_commands": {"ps": command},
            "env": TF_ENV,
            "stop_grace": 3,
        },
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0)
    h = [host.name for host in lab.hosts[:3]]
    got = accuracies(result.stdout)
    assert got.keys() == {f"worker:0@{h[1]}", f"worker:1@{h[2]}"}
    assert min(got.values()) >= 0.90
    # The how-to's program (issue 26): MonitoredTrainingSession on a shared global step; the ps
    # joins forever, so tfdeploy stops it once the workers are done. (worker:1 may find the
    # training done: a non-chief that looked before the chief initialised looks again 30 s later.)
    chief = f"worker:0@{h[1]}"
    assert re.search(rf"^{chief}\s+\| epoch \d+ loss \S+ global_step \d+$", result.stdout, re.M)
    ps_host = lab.hosts[0]
    serving = f"{ps_host.address}:{lab.tf_port(ps_host)}"
    assert f"ps:0@{h[0]} | ps:0: serving on {serving}" in result.stdout
    assert re.search(rf"ps:0@{h[0]} pid \d+ exited \(stopped by tfdeploy\)", result.stdout)


def test_a_failing_task_fails_the_job_fast_and_is_named_first(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    steps = "100000 --peers --fail-at 2 --fail-task worker:1"
    code, command = standin_job(lab, tmp_path, steps)
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "failing", "command": command, "stop_grace": 3},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inventory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    failed = any("worker 1 failing at step 2" in line for line in proc.stdout)
    assert failed, "the task never reached its injected failure"
    # The peer left alone would train on (or hang in its next collective): `up` ends it.
    proc.wait(timeout=60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 1, stderr
    first_error = stderr.splitlines()[0]
    assert first_error.startswith(f"error: worker:1@{lab.hosts[1].name} failed (exit code 3)")
    assert "worker 1 failing at step 2" in stderr  # the failing task's last log lines


def test_redeploy_of_unchanged_code_sends_no_bytes(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "main.py").write_text(
        "print('hello from', __import__('os').environ['TFDEPLOY_TASK'])\n"
    )
    (code / "pkg" / "data.bin").write_bytes(os.urandom(200_000))
    (code / "ignored.log").write_text("never pushed")
    (code / ".gitignore").write_text("*.log\n")
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "redeploy", "command": f"{clean_lab.python} main.py"},
    )
    state = tmp_path / "state"
    first = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    second = tfdeploy("up", str(inventory), state=state, check_rc=0).stdout
    sent = sizes_sent(first + second)
    # Every workdir got every file once: loopback hosts share one home, so one workdir.
    workdirs = 2 if clean_lab.isolated else 1
    assert sent[0] >= workdirs * 200_000  # data.bin is new; main.py may be there already
    assert sent[1] == 0
    assert "pushed 3 files" in second  # main.py, data.bin, .gitignore; not ignored.log
    for i in range(2):
        assert f"worker:{i}@{clean_lab.hosts[i].name} | hello from worker:{i}" in second.replace(
            "  ", " "
        )


def test_detach_then_status_logs_and_down_from_a_fresh_shell(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    script = (
        "import itertools, time\n"
        "for i in itertools.count():\n"
        "    print('tick', i, flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.py").write_text(script)
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "detached", "command": f"{clean_lab.python} tick.py", "stop_grace": 2},
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state", check_rc=0)
    run_id = re.search(r"run (detached-\S+) is running detached", up.stdout)
    assert run_id, up.stdout
    fresh = tmp_path / "other-state"  # as if from another shell or machine: no local record
    status = json.loads(
        tfdeploy("status", str(inventory), "--json", state=fresh, check_rc=0).stdout
    )
    states = {(r["host"], t["name"]): t["state"] for r in status["runs"] for t in r["tasks"]}
    assert states == {
        (clean_lab.hosts[0].name, "worker:0"): "running",
        (clean_lab.hosts[1].name, "worker:1"): "running",
    }
    time.sleep(1.0)
    logs = tfdeploy(
        "logs",
        run_id.group(1),
        "--inventory",
        str(inventory),
        "--task",
        "worker:1",
        state=fresh,
        check_rc=0,
    ).stdout
    ticks = re.findall(r"^worker:1@\S+ \| tick (\d+)$", logs, re.M)
    assert ticks[:3] == ["0", "1", "2"]
    assert "worker:0" not in logs
    down = tfdeploy("down", str(inventory), state=fresh, check_rc=0).stdout
    assert down.count(f"stopped run {run_id.group(1)}") == 2
    after = json.loads(tfdeploy("status", str(inventory), "--json", state=fresh, check_rc=0).stdout)
    assert {t["state"] for r in after["runs"] for t in r["tasks"]} == {"exited"}


@pytest.mark.isolated
def test_an_unreachable_host_fails_preflight_and_nothing_starts(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("import time; time.sleep(60)\n")
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "unreach", "command": f"{lab.python} x.py"},
    )
    lab.kill_sshd(lab.hosts[2])
    try:
        result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    finally:
        lab.start_sshd(lab.hosts[2])
    assert f"{lab.hosts[2].name}: connection refused" in result.stderr
    assert "nothing was started" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for host in lab.hosts[:2]:  # no run directory was even created on the healthy hosts
        listing = lab.run(host, ["sh", "-c", "ls /root/.tfdeploy/hosts/*/runs 2>/dev/null; true"])
        assert listing.returncode == 0
        assert not [r for r in listing.stdout.split() if r.startswith("unreach-")]


def test_a_busy_tf_port_fails_preflight_naming_host_and_port(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("print('never')\n")
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "busy", "command": f"{lab.python} x.py", "port": 2400},
    )
    # Holds the port until its stdin closes, so it ends with the test (over plain OpenSSH).
    port = lab.tf_port(lab.hosts[1], 2400)
    hold = (
        f"import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); "
        "print(1, flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        lab.ssh_argv(lab.hosts[1], lab.python, "-c", f'"{hold}"'),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=3)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    assert f"{lab.hosts[1].name}: TF port(s) {port} already in use" in result.stderr


def test_ctrl_c_while_running_stops_everything_and_exits_130(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    # Ignores SIGTERM like a MultiWorkerMirroredStrategy process: the stop must escalate.
    (code / "stubborn.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\ntime.sleep(300)\n"
    )
    inventory = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job={"name": "ctrlc", "command": f"{clean_lab.python} stubborn.py", "stop_grace": 2},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inventory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")},
    )
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += " | up" in line
        if seen == 2:
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "was stopped" in stderr


def test_a_server_that_never_listens_fails_at_start_timeout(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("import time; time.sleep(120)\n")
    inventory = lab_inventory(
        [[{"role": "ps"}], [{"role": "worker"}]],
        code=code,
        job={
            "name": "deadline",
            "command": f"{clean_lab.python} x.py",
            "role_commands": {"ps": f"{clean_lab.python} x.py"},
            "start_timeout": 3,
            "stop_grace": 1,
        },
    )
    started = time.monotonic()
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=1)
    assert time.monotonic() - started < 30
    assert "ps:0 did not accept connections on its TF port within 3 s" in result.stderr


def test_a_code_file_changing_during_the_push_is_named(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    # The code directory holds the known_hosts file that accept-new appends to while connecting,
    # i.e. after the code was hashed: a real way for a file to change under a push.
    code = tmp_path / "code"
    code.mkdir()
    # Content no host has yet (an empty file may be in a host's store from any earlier push,
    # and a file the host has is not read again): the push must read it, and see it change.
    (code / "known_hosts").write_text(f"# {secrets.token_hex(8)}\n")
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "changing", "command": "true"},
        ssh={"known_hosts": str(code / "known_hosts"), "host_keys": "accept-new"},
        hosts=[clean_lab.hosts[5]],
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=2)
    assert "known_hosts changed while tfdeploy was pushing it" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
