"""Hosts as real fleets have them (issue 11): older Pythons, a non-root user, shared homes.

The lab gives each case what a real fleet would: CPython builds of other versions that hosts
can run (`lab_python`), an unprivileged login user with a private home on each host
(`lab_user_inventory`), and one home shared by all hosts (`lab_shared_home`, like NFS/EFS).
Every case runs the real CLI as a subprocess and checks on every host that no process and no
listening port of the run is left behind.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab, LabHost, LabUnsupported, pythons
from tests.support import standin
from tests.support.lab_cli import tfdeploy as lab_tfdeploy
from tests.support.sizes import sizes_sent

pytestmark = pytest.mark.lab

# A task that looks like a TF process to the deployer and the lab: it serves its TF port (so
# "no port left" means something), says which interpreter runs it, and ticks or ends.
TASK = r"""
import json, os, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
kind, index = cfg["task"]["type"], cfg["task"]["index"]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
address, port = cfg["cluster"][kind][index].rsplit(":", 1)
server.bind((address, int(port)))  # the host's own address: loopback hosts share 0.0.0.0
server.listen()
print("task", os.environ["TFDEPLOY_TASK"], "python", sys.version.split()[0],
      "user", os.getuid(), "home", os.path.expanduser("~"), flush=True)
ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for i in range(ticks if ticks >= 0 else 10**9):
    print("tick", i, flush=True)
    time.sleep(0.2)
"""

# These interpreters have no TensorFlow: preflight accepts that only when a setup step could
# install it. A setup step also runs the agent's setup phase on the host's own Python.
SETUP = ["python3 -c 'print(\"setup ran\")'"]

# Ignores SIGTERM like a MultiWorkerMirroredStrategy process: stopping it must escalate.
STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('up', flush=True)\ntime.sleep(300)\n"
)


# The lab's CLI runner; these tests' commands are quick, so a minute is plenty.
tfdeploy = functools.partial(lab_tfdeploy, timeout=60)


def code_dir(tmp_path: Path, name: str = "task.py", text: str = TASK) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / name).write_text(text)
    return code


def task_lines(output: str) -> dict[str, dict[str, str]]:
    """What each task said about itself: {"worker:0@h1": {"python": "3.9.18", "user": ...}}."""
    found = {}
    for label, rest in re.findall(r"^(\S+@\S+)\s+\| task \S+ (python .*)$", output, re.M):
        words = rest.split()
        found[label] = dict(zip(words[::2], words[1::2], strict=True))
    return found


def labels(hosts: list[LabHost]) -> list[str]:
    return [f"worker:{i}@{h.name}" for i, h in enumerate(hosts)]


def nothing_left(lab: Lab, hosts: list[LabHost]) -> dict[str, list[str]]:
    """Leftovers of every host, each killed so later tests start clean; {} means clean.

    For tests that must report leftovers as their own failure (an xfail test cannot fail in
    `clean_lab`'s teardown without breaking the run).
    """
    left = {h.name: lab.kill_leftovers(h) for h in hosts}
    return {name: items for name, items in left.items() if items}


# ---- the lab's host variety itself ------------------------------------------------------------


def test_lab_python_copies_run_inside_hosts_without_root(
    lab: Lab, lab_python: Callable[[str], str]
) -> None:
    path = lab_python("3.9")
    # As the login user, with an empty environment: no LD_LIBRARY_PATH, no /root.
    probe = f"env -i {path} -c 'import sys, ssl; print(sys.version_info[:2], sys.prefix)'"
    for h in lab.hosts[:2]:
        argv = lab.ssh_argv(h, probe, user=lab.login_user)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[:2] == ["(3,", "9)"]
        assert done.stdout.split()[2] == str(Path(path).parent.parent)


def test_a_broken_interpreter_fails_to_start_with_the_loaders_message(
    lab: Lab, lab_python: Callable[[str], str]
) -> None:
    lab_python("3.10")  # skips where the machine has no 3.10
    broken = pythons.broken_python("3.10")
    done = lab.run(lab.hosts[0], [broken, "-V"])
    assert done.returncode == 127
    assert "libpython3.10.so.1.0: cannot open shared object file" in done.stderr


def test_lab_python_skips_with_a_reason_for_a_missing_version() -> None:
    with pytest.raises(LabUnsupported) as info:
        pythons.host_python("3.99")
    assert "no CPython 3.99 build on this machine" in str(info.value)


@pytest.mark.isolated
def test_login_user_homes_are_private_unless_shared(lab: Lab) -> None:
    h1, h2 = lab.hosts[:2]

    def as_user(h: LabHost, cmd: str) -> str:
        argv = lab.ssh_argv(h, cmd, user=lab.login_user)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert as_user(h1, "id -un") == lab.login_user
    as_user(h1, "touch ~/only-on-h1")
    assert as_user(h2, "ls -A ~") == ""
    with lab.shared_home() as shared:
        as_user(h1, "touch ~/from-h1")
        assert as_user(h2, "ls -A ~") == "from-h1"
        assert (shared / "from-h1").owner() == lab.login_user
    assert as_user(h2, "ls -A ~") == ""  # private again, and fresh
    assert as_user(h1, "ls -A ~") == ""


# ---- the lifecycle on hosts with other Pythons ------------------------------------------------


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10"])
def test_plain_job_on_hosts_whose_python_is(
    minor: str,
    clean_lab: Lab,
    lab_inventory: Any,
    lab_python: Callable[[str], str],
    tmp_path: Path,
) -> None:
    py = lab_python(minor)
    hosts = clean_lab.hosts[:2]
    inventory = lab_inventory(
        [[{"role": "worker"}]] * 2,
        code=code_dir(tmp_path),
        job={
            "name": "py" + minor.replace(".", ""),
            "python": py,
            "command": f"{py} task.py",
            "setup": SETUP,
        },
        hosts=hosts,
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    said = task_lines(out)
    assert said.keys() == set(labels(hosts)), out
    assert {s["python"].rsplit(".", 1)[0] for s in said.values()} == {minor}
    for label in labels(hosts):
        assert re.search(rf"^{re.escape(label)}\s+\| tick 2$", out, re.M), out


def test_one_job_across_hosts_with_different_pythons(
    clean_lab: Lab, lab_inventory: Any, lab_python: Callable[[str], str], tmp_path: Path
) -> None:
    minors = ["3.9", "3.10"] + (["3.8"] if "3.8" in pythons.available() else [])
    hosts = clean_lab.hosts[: len(minors)]
    per_host = {h.name: {"python": lab_python(m)} for h, m in zip(hosts, minors, strict=True)}
    inventory = lab_inventory(
        [[{"role": "worker", "command": f"{per_host[h.name]['python']} task.py"}] for h in hosts],
        code=code_dir(tmp_path),
        job={"name": "mixed", "setup": SETUP},
        hosts=hosts,
        per_host=per_host,
    )
    out = tfdeploy("up", str(inventory), state=tmp_path / "state", check_rc=0).stdout
    said = task_lines(out)
    got = {label: said[label]["python"].rsplit(".", 1)[0] for label in labels(hosts)}
    assert got == dict(zip(labels(hosts), minors, strict=True))


# ---- a non-root user --------------------------------------------------------------------------


@pytest.mark.isolated
def test_non_root_user_up_status_logs_down_with_private_homes(
    clean_lab: Lab, lab_user_inventory: Any, lab_python: Callable[[str], str], tmp_path: Path
) -> None:
    lab = clean_lab
    py = lab_python("3.10")
    hosts = lab.hosts[:2]
    inventory = lab_user_inventory(
        [[{"role": "worker"}]] * 2,
        code=code_dir(tmp_path),
        job={
            "name": "nonroot",
            "python": py,
            "command": f"{py} task.py -1",
            "setup": SETUP,
            "stop_grace": 2,
        },
        hosts=hosts,
    )
    state = tmp_path / "state"
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    run_id = re.search(r"run (nonroot-\S+) is running detached", up.stdout)
    assert run_id, up.stdout
    status = json.loads(tfdeploy("status", str(inventory), "--json", state=state).stdout)
    states = {(r["host"], t["name"]): t["state"] for r in status["runs"] for t in r["tasks"]}
    assert states == {(h.name, f"worker:{i}"): "running" for i, h in enumerate(hosts)}
    for h in hosts:  # each host's run lives in the user's own home, owned by the user
        done = lab.run(h, ["stat", "-c", "%U", f"/home/{lab.login_user}/.tfdeploy"])
        assert done.stdout.strip() == lab.login_user, done.stderr
        assert not [p for p in lab.processes(h) if p.user == "root" and "task.py" in p.cmdline]
    time.sleep(0.6)
    logs = tfdeploy(
        "logs", run_id.group(1), "--inventory", str(inventory), state=state, check_rc=0
    ).stdout
    said = task_lines(logs)
    assert {s["user"] for s in said.values()} != {"0"}
    assert {s["home"] for s in said.values()} == {f"/home/{lab.login_user}"}
    down = tfdeploy("down", str(inventory), state=state, check_rc=0).stdout
    assert down.count(f"stopped run {run_id.group(1)}") == 2
    after = json.loads(tfdeploy("status", str(inventory), "--json", state=state).stdout)
    assert {t["state"] for r in after["runs"] for t in r["tasks"]} == {"exited"}


@pytest.mark.isolated
def test_ctrl_c_as_non_root_stops_everything_and_exits_130(
    clean_lab: Lab, lab_user_inventory: Any, tmp_path: Path
) -> None:
    inventory = lab_user_inventory(
        [[{"role": "worker"}]] * 2,
        code=code_dir(tmp_path, "stubborn.py", STUBBORN),
        job={"name": "ctrlc", "command": f"{clean_lab.python} stubborn.py", "stop_grace": 2},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "up", str(inventory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state")},
    )
    try:
        assert proc.stdout is not None
        seen = 0
        for line in proc.stdout:
            seen += " | up" in line
            if seen == 2:
                break
        running = [p for h in clean_lab.hosts[:2] for p in clean_lab.processes(h)]
        assert {p.user for p in running if "stubborn.py" in p.cmdline} == {clean_lab.login_user}
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "was stopped" in stderr


# ---- a home shared by every host (NFS/EFS) ---------------------------------------------------


@pytest.mark.isolated
def test_shared_home_lifecycle_as_non_root(
    lab: Lab, lab_user_inventory: Any, lab_shared_home: Path, tmp_path: Path
) -> None:
    hosts = lab.hosts[:3]
    inventory = lab_user_inventory(
        [[{"role": "worker"}]] * 3,
        code=code_dir(tmp_path),
        job={"name": "shared", "command": f"{lab.python} task.py", "stop_grace": 2},
        hosts=hosts,
    )
    state = tmp_path / "state"
    try:
        out = tfdeploy("up", str(inventory), state=state, timeout=45, check_rc=0).stdout
        said = task_lines(out)
        assert said.keys() == set(labels(hosts)), out
        assert {s["home"] for s in said.values()} == {f"/home/{lab.login_user}"}
        assert (lab_shared_home / ".tfdeploy").is_dir()  # the default workdir is the shared one
        job = {"name": "shared", "command": f"{lab.python} task.py -1", "stop_grace": 2}
        inventory = lab_user_inventory(
            [[{"role": "worker"}]] * 3, code=inventory.parent / "code", job=job, hosts=hosts
        )
        up = tfdeploy("up", "--detach", str(inventory), state=state, timeout=45, check_rc=0)
        run_id = re.search(r"run (shared-\S+) is running detached", up.stdout)
        assert run_id, up.stdout
        status = json.loads(tfdeploy("status", str(inventory), "--json", state=state).stdout)
        ours = [r for r in status["runs"] if r["run_id"] == run_id.group(1)]  # not the first run
        states = {(r["host"], t["name"]): t["state"] for r in ours for t in r["tasks"]}
        running = {k: v for k, v in states.items() if v == "running"}
        assert running == {(h.name, f"worker:{i}"): "running" for i, h in enumerate(hosts)}
        down = tfdeploy("down", str(inventory), state=state, check_rc=0).stdout
        assert down.count(f"stopped run {run_id.group(1)}") == 3
    finally:
        left = nothing_left(lab, hosts)
    assert left == {}, f"the run left processes or ports behind: {left}"


@pytest.mark.isolated
def test_shared_home_push_sends_each_content_once(
    lab: Lab, lab_user_inventory: Any, lab_shared_home: Path, tmp_path: Path
) -> None:
    hosts = lab.hosts[:3]
    code = code_dir(tmp_path)
    (code / "data.bin").write_bytes(os.urandom(300_000))
    inventory = lab_user_inventory(
        [[{"role": "worker"}]] * 3,
        code=code,
        job={"name": "pushonce", "command": f"{lab.python} task.py 0", "stop_grace": 2},
        hosts=hosts,
    )
    try:
        out = tfdeploy(
            "up", str(inventory), state=tmp_path / "state", timeout=45, check_rc=0
        ).stdout
        sent = sizes_sent(out)
        # The three hosts share one store: the 300 kB cross the wire once, not three times.
        assert sent and 300_000 <= sent[0] < 2 * 300_000, out
    finally:
        left = nothing_left(lab, hosts)
    assert left == {}, f"the run left processes or ports behind: {left}"


@pytest.mark.needs_tf(reason="preflight wants TensorFlow on the hosts; the tasks never import it")
@pytest.mark.slow
def test_a_cluster_as_non_root_with_a_shared_home_runs_to_its_end(
    lab: Lab, lab_user_inventory: Any, lab_shared_home: Path, tmp_path: Path
) -> None:
    """3 workers of one cluster, an unprivileged user whose home is one directory on every host
    (the default workdir is shared): each task's folders on that one home are its own (their
    checkpoints and metrics do not collide), they reach each other, exit 0, leave nothing behind.
    The tasks are the TF-shaped stand-in (tests/support/standin.py): the subject is the shared
    home; real MWMS across hosts is tests/integration/test_seed_programs.py's."""
    hosts = lab.hosts[:3]
    code = tmp_path / "code"
    standin.write(code)
    steps = 4
    inventory = lab_user_inventory(
        [[{"role": "worker"}]] * 3,
        code=code,
        job={
            "name": "sharedtf",
            "command": f"{lab.python} {standin.NAME} {steps} --peers",
            "stop_grace": 2,
        },
        hosts=hosts,
    )
    try:
        out = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=300, check_rc=0)
        said = out.stdout
        reached = dict(re.findall(r"^(worker:\d@\S+) +\| worker \d reached (.*)$", said, re.M))
        assert reached == {
            label: " ".join(f"worker:{j}" for j in range(3) if j != i)
            for i, label in enumerate(labels(hosts))
        }, said
        done = re.findall(rf"^(worker:\d@\S+) +\| worker \d done at step {steps}$", said, re.M)
        assert sorted(done) == labels(hosts), said
        assert "share one workdir" in said
        assert (lab_shared_home / ".tfdeploy" / "store").is_dir()
        # Each host's folders of the run, all on the one home, hold that host's task alone: its
        # checkpoint at the last step and a metrics record a step, no other task's.
        run_id = re.search(r"sharedtf-\d{8}T\d{6}Z-\w+", said)
        assert run_id, said
        runs = sorted(lab_shared_home.glob(f".tfdeploy/hosts/*/runs/{run_id.group(0)}"))
        kept = []
        for run in runs:
            tasks = [t.name for t in (run / "tasks").iterdir()]
            saved = [c.name for c in (run / "code" / "ckpt").iterdir()]
            assert len(tasks) == 1 and saved == tasks, run
            records = (run / "tasks" / tasks[0] / "metrics.jsonl").read_text().splitlines()
            step = (run / "code" / "ckpt" / tasks[0]).read_text()
            kept.append((tasks[0], step, len(records)))
        assert sorted(kept) == [(f"worker-{i}", str(steps), steps) for i in range(3)], kept
    finally:
        left = nothing_left(lab, hosts)
    assert left == {}, f"the run left processes or ports behind: {left}"
