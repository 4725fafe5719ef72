"""Inventory mistakes that `up` used to find only on the hosts: `plan` rejects each, exit 2.

Every case names the file, the key and what was expected, before any host is contacted.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from deployer.config.inventory import MAX_JOB_NAME
from deployer.results import state
from tests.support.helpers import JOB, one_line, plan, run_cli, tf_config, write_toml

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

HOST = '[[hosts]]\naddress = "10.0.0.1"\n'
CHIEF = HOST + 'tasks = [{ role = "chief" }]\n'
ENV_RULE = "of letters, digits and _, not starting with a digit"
NUL = (
    "expected a string without NUL characters (\\0): no command, path or environment value "
    "can hold one"
)


def task(extra: str) -> str:
    return JOB + HOST + f'tasks = [{{ role = "chief", {extra} }}]\n'


CASES = [
    pytest.param(
        JOB + 'env = { "" = "1" }\n' + CHIEF,
        f"job.env: expected variable names {ENV_RULE}, got ''",
        None,
        id="env-name-empty",
    ),
    pytest.param(
        JOB + 'env = { "A B" = "1" }\n' + CHIEF,
        f"job.env: expected variable names {ENV_RULE}, got 'A B'",
        None,
        id="env-name-space",
    ),
    pytest.param(
        task('env = { "A=B" = "1" }'),
        f"hosts[0].tasks[0].env: expected variable names {ENV_RULE}, got 'A=B'",
        None,
        id="env-name-equals",
    ),
    pytest.param(
        JOB + 'env = { A = "x\\u0000y" }\n' + CHIEF,
        f"job.env.A: {NUL}",
        None,
        id="env-value-nul",
    ),
    pytest.param(
        task('env = { A = "\\u0000" }'),
        f"hosts[0].tasks[0].env.A: {NUL}",
        None,
        id="task-env-value-nul",
    ),
    pytest.param(
        JOB.replace("train.py", "train.py\\u0000") + CHIEF,
        f"job.command: {NUL}",
        None,
        id="command-nul",
    ),
    pytest.param(
        JOB + 'setup = ["ok", "a\\u0000"]\n' + CHIEF,
        f"job.setup[1]: {NUL}",
        None,
        id="setup-nul",
    ),
    pytest.param(
        JOB + 'secret_env = ["TOKEN", "A B"]\n' + CHIEF,
        f"job.secret_env[1]: expected an environment variable name {ENV_RULE}, got 'A B'",
        None,
        id="secret-env-name",
    ),
    pytest.param(
        JOB + 'forward_env = ["1X"]\n' + CHIEF,
        f"job.forward_env[0]: expected an environment variable name {ENV_RULE}, got '1X'",
        None,
        id="forward-env-name",
    ),
    pytest.param(
        task('cpus = "3-1"'),
        "hosts[0].tasks[0].cpus: expected ranges from low to high, got '3-1' in '3-1'",
        None,
        id="cpus-reversed",
    ),
    pytest.param(
        task('cpus = "0,5-4"'),
        "hosts[0].tasks[0].cpus: expected ranges from low to high, got '5-4' in '0,5-4'",
        None,
        id="cpus-reversed-later",
    ),
    pytest.param(
        task('command = "tfdeploy:srever"'),
        "hosts[0].tasks[0].command: unknown built-in command 'tfdeploy:srever' "
        "(built-ins: tfdeploy:server)",
        "did you mean 'tfdeploy:server'?",
        id="builtin-typo-task",
    ),
    pytest.param(
        JOB + '[job.role_commands]\nps = "tfdeploy:sever"\n' + CHIEF,
        "job.role_commands.ps: unknown built-in command 'tfdeploy:sever' "
        "(built-ins: tfdeploy:server)",
        "did you mean 'tfdeploy:server'?",
        id="builtin-typo-role-command",
    ),
    pytest.param(
        JOB.replace("python3 train.py", "tfdeploy:train") + CHIEF,
        "job.command: unknown built-in command 'tfdeploy:train' (built-ins: tfdeploy:server)",
        None,
        id="builtin-unknown-no-suggestion",
    ),
    pytest.param(
        JOB.replace('name = "j"', f'name = "{"j" * (MAX_JOB_NAME + 1)}"') + CHIEF,
        f"job.name: expected a job name of at most {MAX_JOB_NAME} characters, got "
        f"{MAX_JOB_NAME + 1}: it starts every run id, which names a directory on each host",
        None,
        id="job-name-too-long",
    ),
    pytest.param(
        JOB + CHIEF.replace('"10.0.0.1"', '"10.0.0.1"\ntf_address = "10.0.0.1:99"'),
        "hosts[0].tf_address: expected a host name or an IP address without a port, got "
        "'10.0.0.1:99'",
        "give the port with port",
        id="tf-address-with-port",
    ),
    pytest.param(
        JOB + CHIEF.replace('"10.0.0.1"', '"10.0.0.1"\ntf_address = "a b"'),
        "hosts[0].tf_address: expected a host name or an IP address, got 'a b'",
        None,
        id="tf-address-space",
    ),
    pytest.param(
        JOB + CHIEF.replace('"10.0.0.1"', '"[::1]:2200"'),
        "hosts[0].address: expected a host name or an IP address without a port, got '[::1]:2200'",
        "give the port with ssh.port",
        id="address-with-port",
    ),
    pytest.param(
        JOB + CHIEF.replace('"10.0.0.1"', '"me@gpu1"'),
        "hosts[0].address: expected a host name or an IP address, got 'me@gpu1'",
        "give the user with ssh.user",
        id="address-with-user",
    ),
    pytest.param(
        JOB + CHIEF.replace('"10.0.0.1"', '"[gpu1]"'),
        "hosts[0].address: expected a host name or an IP address, got '[gpu1]'",
        None,
        id="brackets-around-a-name",
    ),
    pytest.param(
        JOB + 'workdir = "runs/x"\n' + CHIEF,
        "job.workdir: expected an absolute path or one starting with ~, got 'runs/x'",
        'a relative path depends on where tfdeploy runs; write e.g. "~/runs/x"',
        id="job-workdir-relative",
    ),
    pytest.param(
        JOB + CHIEF + 'workdir = "./tfd"\n',
        "hosts[0].workdir: expected an absolute path or one starting with ~, got './tfd'",
        'a relative path depends on where tfdeploy runs; write e.g. "~/tfd"',
        id="host-workdir-relative",
    ),
    pytest.param(
        task("threads = 0"),
        "hosts[0].tasks[0].threads: expected an integer of at least 1 and at most 4096, got 0",
        None,
        id="threads-zero",
    ),
]


@pytest.mark.parametrize(("text", "message", "hint"), CASES)
def test_plan_rejects_with_exit_2(
    tmp_path: Path, text: str, message: str, hint: str | None
) -> None:
    path = write_toml(tmp_path, text)
    code, out, err = run_cli("plan", str(path))
    assert (code, out) == (2, "")
    expected = f"error: {path}: {message}" + (f" hint: {hint}" if hint else "")
    assert one_line(err) == one_line(expected)


def test_the_longest_job_name_still_makes_state_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap leaves room for the rest of the run id and the state file's own affixes."""
    monkeypatch.setenv("TFDEPLOY_STATE_DIR", str(tmp_path / "state"))
    run_id = state.new_run_id("j" * MAX_JOB_NAME)
    state.save(state.RunRecord(run_id, "/inv.toml", "j", 0.0, False))
    assert state.load(run_id) is not None


def test_builtin_with_spaces_is_the_builtin(tmp_path: Path) -> None:
    """The agent strips the command before comparing; the plan must agree it is a server."""
    p = plan(
        tmp_path,
        JOB
        + 'role_commands = { ps = " tfdeploy:server " }\n'
        + CHIEF
        + HOST.replace("10.0.0.1", "10.0.0.2")
        + 'tasks = [{ role = "ps" }]\n',
    )
    assert p.task("ps:0").is_server and p.task("ps:0").command == "tfdeploy:server"


def test_threads_and_env_names_that_are_fine(tmp_path: Path) -> None:
    p = plan(tmp_path, task('threads = 1, env = { _A1 = "", lower_case = "x y=z" }'))
    assert p.task("chief:0").env["OMP_NUM_THREADS"] == "1"
    assert p.task("chief:0").env["lower_case"] == "x y=z"


@pytest.mark.parametrize("written", ["::1", "[::1]"])
def test_ipv6_addresses_are_bracketed_in_tf_config(tmp_path: Path, written: str) -> None:
    text = JOB.replace("[job]", "[job]\nport = 23300") + CHIEF.replace('"10.0.0.1"', f'"{written}"')
    p = plan(tmp_path, text)
    chief = p.task("chief:0")
    assert chief.address == "::1" and chief.endpoint == "[::1]:23300"
    assert tf_config(p, "chief:0")["cluster"] == {"chief": ["[::1]:23300"]}


def test_host_names_and_ipv4_addresses_stay_as_written(tmp_path: Path) -> None:
    text = CHIEF.replace('"10.0.0.1"', '"gpu-1.example.org"\ntf_address = "10.0.0.1"')
    p = plan(tmp_path, JOB + text)
    assert p.hosts[0].address == "gpu-1.example.org"
    assert tf_config(p, "chief:0")["cluster"] == {"chief": ["10.0.0.1:2222"]}


@pytest.mark.parametrize("workdir", ["/srv/tfd", "~/x", "~", "~user/tfd"])
def test_absolute_and_home_workdirs_are_accepted(tmp_path: Path, workdir: str) -> None:
    assert plan(tmp_path, JOB + CHIEF + f'workdir = "{workdir}"\n').hosts[0].workdir == workdir


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = write_toml(tmp_path, JOB + CHIEF)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    code, out, err = run_cli("plan", str(path))
    assert (code, err) == (0, ""), err
    assert "chief:0" in out


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "inventory.toml"
    os.mkfifo(fifo)
    result: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: result.append(run_cli("plan", str(fifo))), daemon=True)
    worker.start()
    worker.join(10)
    if not result:  # unblock the reader so the thread ends, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("plan blocked reading a FIFO")
    code, out, err = result[0]
    assert (code, out) == (2, "")
    assert one_line(err) == one_line(
        f"error: {fifo}: expected a regular file, but this is a named pipe (FIFO) "
        "hint: name the inventory's TOML file"
    )


@pytest.mark.parametrize(
    ("where", "kind"), [("dir", "a directory"), ("/dev/null", "a character device")]
)
def test_directories_and_devices_are_refused(tmp_path: Path, where: str, kind: str) -> None:
    path = tmp_path if where == "dir" else Path(where)
    code, out, err = run_cli("plan", str(path))
    assert (code, out) == (2, "")
    assert one_line(err) == one_line(
        f"error: {path}: expected a regular file, but this is {kind} "
        "hint: name the inventory's TOML file"
    )
