"""Security on the lab: bastions end to end, host keys at the CLI, hostile input, secrets on hosts.

Everything runs the real CLI against real sshd hosts; what a task received is read from the task
itself, and what others could see (`ps`, file modes) from the host's own /proc and filesystem.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.lab import Lab
from tests.lab.inventory import toml_value
from tests.support import standin
from tests.support.helpers import HOSTILE_STRINGS
from tests.support.lab_cli import tfdeploy

pytestmark = pytest.mark.lab

# -- bastions ----------------------------------------------------------------------------------


# The job's tasks are the TF-shaped stand-in (tests/support/standin.py): the subject is
# tfdeploy's routing through the bastion, not TensorFlow. With --peers each task dials the other
# at its tf_address before its first step, as MWMS's collectives do: the private hosts' network
# carried the cluster both ways (real MWMS across hosts: tests/integration/test_seed_programs.py).
STEPS = 4
PREFLIGHT_TF = "preflight wants TensorFlow on the hosts; the tasks never import it"


def _standin_code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    standin.write(code)
    return code


@pytest.mark.needs_tf(reason=PREFLIGHT_TF)
@pytest.mark.slow
@pytest.mark.isolated  # private hosts exist only in the namespace lab
def test_a_job_through_the_bastion_with_jump(bastion_lab: Lab, tmp_path: Path) -> None:
    lab = bastion_lab
    assert lab.bastion is not None
    inventory = lab.write_inventory(  # sets jump = "root@BASTION:22" in [ssh]
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}], [{"role": "worker"}]],
        job={
            "name": "viajump",
            "code": str(_standin_code(tmp_path)),
            "command": f"{lab.python} {standin.NAME} {STEPS} --peers",
            "stop_grace": 3,
        },
    )
    assert f"jump = {toml_value(f'root@{lab.bastion.address}:22')}" in inventory.read_text()
    check_private_run(lab, inventory, tmp_path)


@pytest.mark.needs_tf(reason=PREFLIGHT_TF)
@pytest.mark.slow
@pytest.mark.isolated
def test_a_job_through_an_ssh_config_proxyjump_alias(bastion_lab: Lab, tmp_path: Path) -> None:
    lab = bastion_lab
    # The hosts are named by their ssh_config aliases only: HostName, Port, User, IdentityFile
    # and ProxyJump all come from the file; the cluster's traffic uses the private addresses.
    text = "\n".join(
        [
            "[job]",
            'name = "viaalias"',
            f"code = {toml_value(str(_standin_code(tmp_path)))}",
            f"command = {toml_value(f'{lab.python} {standin.NAME} {STEPS} --peers')}",
            f"python = {toml_value(lab.python)}",
            "stop_grace = 3",
            "",
            "[ssh]",
            f"ssh_config = {toml_value(str(lab.ssh_config))}",
            f"known_hosts = {toml_value(str(lab.known_hosts))}",
            "connect_timeout = 5",
        ]
    )
    for h in lab.hosts[:2]:
        text += "\n\n[[hosts]]\n"
        text += f"address = {toml_value(h.name)}\ntf_address = {toml_value(h.address)}\n"
        text += 'tasks = [{ role = "worker" }]\n'
    inventory = tmp_path / "alias.toml"
    inventory.write_text(text)
    assert "ProxyJump bastion" in lab.ssh_config.read_text()
    check_private_run(lab, inventory, tmp_path)


def check_private_run(lab: Lab, inventory: Path, tmp_path: Path) -> None:
    h = lab.hosts[:2]
    assert not lab.reachable_from_root(h[0]), "the private hosts must need the bastion"
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=240, check_rc=0)
    out = result.stdout
    labels = [f"worker:{i}@{h[i].name}" for i in range(2)]
    reached = dict(re.findall(r"^(\S+@\S+)\s+\| worker \d reached (.*)$", out, re.M))
    assert reached == {labels[0]: "worker:1", labels[1]: "worker:0"}, out  # each dialled the other
    done = re.findall(rf"^(\S+@\S+)\s+\| worker \d done at step {STEPS}$", out, re.M)
    assert sorted(done) == labels, out
    for host in h:
        assert lab.leftovers(host) == [], f"{host.name} kept processes or ports"


# -- host keys at the CLI ------------------------------------------------------------------------


def test_unknown_host_under_strict_exits_3_before_any_command(
    lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    host = lab.hosts[6]
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    workdir = f"/tmp/tfdeploy-strict-{os.getpid()}"
    code = tmp_path / "code"  # not tmp_path itself: accept-new writes `known` during the push
    code.mkdir()
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "strict", "command": "true", "workdir": workdir},
        ssh={"known_hosts": str(known)},
        hosts=[host],
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=60, check_rc=3)
    err = " ".join(result.stderr.split())
    # known_hosts names a host on another port than 22 as [address]:port (the loopback lab's)
    key = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    assert f"{host.name}: host key of {key} is not in {known}" in err
    assert f"ssh-keyscan -p {host.port} {host.address} >> {known}" in err
    assert 'host_keys = "accept-new"' in err
    assert known.read_text() == ""
    assert lab.run(host, ["test", "-e", workdir]).returncode == 1, "a command ran on the host"

    # accept-new records the key (and then works); strict trusts the recorded key afterwards.
    lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={"name": "strict", "command": "true", "workdir": workdir},
        ssh={"known_hosts": str(known), "host_keys": "accept-new"},
        hosts=[host],
    )
    tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=60, check_rc=0)
    assert known.read_text().startswith(f"{key} ssh-ed25519 ")
    lab.run(host, ["rm", "-rf", workdir])


# -- hostile input -----------------------------------------------------------------------------

CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")
HOSTILE_ALPHABET = st.sampled_from(list("'\"$()`;|&<>\n\r\t \\*?~{}[]#!-=é✓日\u00a0"))


def hostile(marker: str) -> st.SearchStrategy[str]:
    templated = st.sampled_from(HOSTILE_STRINGS).map(lambda s: s.replace("MARK", marker))
    mixed = st.lists(st.one_of(HOSTILE_ALPHABET, CHARS), max_size=24).map("".join)
    return st.one_of(templated, mixed)


# Dumps what the task received (argv, env, its code directory's file names) as one base64 line.
DUMP = """\
import base64, json, os, sys
names = sorted(n for n in os.listdir(".") if n != "dump.py")
data = {"argv": sys.argv[1:], "env": dict(os.environ), "files": names}
print("DUMP", base64.b64encode(json.dumps(data).encode()).decode(), flush=True)
"""

MARKER = f"/tmp/tfdeploy-hostile-{os.getpid()}"


def safe_filename(value: str) -> bool:
    return bool(value) and "/" not in value and value not in (".", "..") and len(value) < 100


@pytest.mark.isolated  # markers are looked for in the host's own private /tmp
@settings(
    max_examples=3,  # each example is one `up` of 8 hostile strings: ~25 strings in all
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: every example costs an `up`
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(hostile(MARKER), min_size=8, max_size=8))
def test_hostile_strings_reach_the_task_byte_for_byte(
    clean_lab: Lab, lab_inventory: Any, tmp_path_factory: pytest.TempPathFactory, values: list[str]
) -> None:
    lab = clean_lab
    host = lab.hosts[7]
    tmp = tmp_path_factory.mktemp("hostile")
    code = tmp / "code"
    code.mkdir()
    (code / "dump.py").write_text(DUMP)
    files = sorted({v for v in values if safe_filename(v) and not v.startswith(".")})
    for name in files:
        (code / name).write_text("x")
    env = {f"HOSTILE_{i}": v for i, v in enumerate(values)}
    # The command is a shell string the user quotes; tfdeploy must hand it to sh -c unchanged.
    args = " ".join(shlex.quote(v).replace("{", "{{").replace("}", "}}") for v in values)
    workdir = f"/tmp/tfd w'\"$(touch {MARKER})`touch {MARKER}`;"
    inventory = lab_inventory(
        [[{"role": "worker", "env": env}]],
        code=code,
        job={"name": "hostile", "command": f"{lab.python} dump.py {args}", "workdir": workdir},
        hosts=[host],
    )
    result = tfdeploy("up", str(inventory), state=tmp / "state", timeout=120, check_rc=0)
    found = re.search(r"\| DUMP (\S+)$", result.stdout, re.M)
    assert found, result.stdout
    got = json.loads(base64.b64decode(found.group(1)))
    assert got["argv"] == values
    for key, value in env.items():
        assert got["env"][key] == value, key
    assert [f for f in got["files"] if not f.startswith(".")] == files
    assert lab.run(host, ["sh", "-c", f"ls -d {MARKER}* 2>/dev/null"]).stdout == ""
    assert not Path(MARKER).exists()
    lab.run(host, ["rm", "-rf", workdir])


def test_hostile_host_names_and_run_ids_are_refused(
    lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    for name in ("../etc", "a/b", "..", "h1;touch x", "$(id)", ".hidden"):
        inventory = lab_inventory([[{"role": "worker"}]], job={"command": "true"})
        text = inventory.read_text().replace(
            f"name = {toml_value(lab.hosts[0].name)}", f"name = {toml_value(name)}"
        )
        inventory.write_text(text)
        result = tfdeploy("plan", str(inventory), state=tmp_path / "state", check_rc=2)
        assert "hosts[0].name" in result.stderr, result.stderr
    for run_id in ("../../etc", "a/b", "..", "x;y"):
        result = tfdeploy(
            "status", run_id, "-i", str(inventory), state=tmp_path / "state", timeout=60
        )
        assert result.returncode != 0
        assert "Traceback" not in result.stderr


# -- secrets -----------------------------------------------------------------------------------

SECRET = "s3cr3t-Value-4711"
LISTED = "listed-value-0815"

# Reads every process's command line on its host; the test runs it while the task runs.
CMDLINES = """\
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            print(pid, f.read().replace(b"\\0", b" ").decode(errors="replace"))
    except OSError:
        pass
"""


def test_secrets_stay_off_command_lines_and_out_of_reach(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    host = lab.hosts[5]
    code = tmp_path / "code"
    code.mkdir()
    (code / "wait.py").write_text(
        "import os, sys, time\n"
        "print('task up', flush=True)\n"
        "time.sleep(60)\n"
        "sys.exit(0 if os.environ['API_TOKEN'] else 1)\n"
    )
    env = {"API_TOKEN": SECRET, "WANDB_API": LISTED, "PLAIN": "visible"}
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        code=code,
        job={
            "name": "secret",
            "command": f"{lab.python} wait.py",
            "env": env,
            "secret_env": ["WANDB_API"],
            "stop_grace": 1,
        },
        hosts=[host],
    )
    state = tmp_path / "state"
    plan = tfdeploy("plan", str(inventory), state=state, check_rc=0).stdout
    plan_json = tfdeploy("plan", str(inventory), "--json", state=state, check_rc=0).stdout
    for shown in (plan, plan_json):
        assert SECRET not in shown and LISTED not in shown
    assert json.loads(plan_json)["job"]["env"] == {
        "API_TOKEN": "********",
        "WANDB_API": "********",
        "PLAIN": "visible",
    }
    up = tfdeploy("up", "--detach", str(inventory), state=state, check_rc=0)
    try:
        run_id = re.search(r"run (secret-\S+) is running detached", up.stdout)
        assert run_id, up.stdout
        # Records are per host (WORKDIR/hosts/<host id>/runs/<run id>: docs/PROTOCOL.md).
        glob = f"~/.tfdeploy/hosts/*/runs/{run_id.group(1)}"  # the login's home: root's or yours
        run_dir = lab.run(host, ["sh", "-c", f"echo {glob}"]).stdout.strip()
        assert "*" not in run_dir, run_dir
        cmdlines = lab.run(host, ["/usr/bin/python3", "-c", CMDLINES]).stdout
        assert "wait.py" in cmdlines  # the task is there to be seen
        assert SECRET not in cmdlines and LISTED not in cmdlines, cmdlines
        task_pid = next(
            line.split()[0] for line in cmdlines.splitlines() if line.endswith("wait.py ")
        )
        environ = lab.run(host, ["cat", f"/proc/{task_pid}/environ"]).stdout
        assert f"API_TOKEN={SECRET}" in environ  # ...and it did get the secret, another way

        modes = lab.run(
            host,
            ["find", run_dir, "-path", f"{run_dir}/code", "-prune", "-o", "-printf", "%m %y %P\n"],
        ).stdout.splitlines()
        assert modes[0].startswith("700 d"), modes
        open_to_others = [m for m in modes if int(m.split()[0], 8) & 0o077]
        holders = lab.run(host, ["grep", "-rl", SECRET, run_dir]).stdout.split()
        assert holders, "the secret must be somewhere on the host for the task to get it"
        for path in holders:
            mode = lab.run(host, ["stat", "-c", "%a", path]).stdout.strip()
            assert mode == "600", f"{path} holds a secret with mode {mode}"
        for parent in (str(Path(run_dir).parent), run_dir):
            assert lab.run(host, ["stat", "-c", "%a", parent]).stdout.strip() == "700", parent
        status = tfdeploy("status", str(inventory), state=state, check_rc=0)
        logs = tfdeploy("logs", run_id.group(1), state=state, check_rc=0)
        for shown in (up.stdout, up.stderr, status.stdout, logs.stdout, logs.stderr):
            assert SECRET not in shown and LISTED not in shown
        print("files open to others below the 0700 run dir:", open_to_others)
    finally:
        tfdeploy("down", str(inventory), state=state, check_rc=0)


def test_a_failing_setup_masks_secrets_in_its_error(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    inventory = lab_inventory(
        [[{"role": "worker"}]],
        job={
            "name": "setupsecret",
            "command": "true",
            "env": {"DB_PASSWORD": SECRET},
            "setup": ['echo "connecting with $DB_PASSWORD"; exit 4'],
        },
        hosts=[lab.hosts[4]],
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=60, check_rc=3)
    assert "setup failed (exit code 4)" in result.stderr
    assert "connecting with ********" in result.stderr
    assert SECRET not in result.stdout + result.stderr
