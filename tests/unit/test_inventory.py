"""Reading an inventory: defaults, per-host overrides, and one exact message per kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory
from deployer.config.model import SSHSettings, TaskSpec
from deployer.config.roles import BUILTIN_SERVER
from deployer.core.errors import ExitStatus, InventoryError
from tests.support.helpers import JOB, load, write_toml

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

ONE_HOST = (
    JOB
    + """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "chief" }]
"""
)


def error(tmp_path: Path, text: str) -> InventoryError:
    path = write_toml(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.path == str(path)
    assert info.value.exit_status == ExitStatus.USAGE
    return info.value


def test_defaults(tmp_path: Path) -> None:
    inv = load(tmp_path, ONE_HOST)
    job = inv.job
    assert (job.name, job.command, job.python, job.workdir, job.port) == (
        "j",
        "python3 train.py",
        "python3",
        "~/.tfdeploy",
        2222,
    )
    assert job.code == (tmp_path / "code").resolve()
    assert (job.env, job.setup, job.secret_env) == ({}, (), ())
    assert job.role_commands == {"ps": BUILTIN_SERVER}
    (host,) = inv.hosts
    assert (host.name, host.address, host.tf_address, host.port, host.gpus) == (
        "10.0.0.1",
        "10.0.0.1",
        "10.0.0.1",
        2222,
        0,
    )
    assert (host.share_gpus, host.python, host.workdir) == (False, "python3", "~/.tfdeploy")
    assert host.ssh == SSHSettings()
    assert host.tasks == (TaskSpec(role="chief", key="hosts[0].tasks[0]"),)


def test_all_keys_are_read(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        """
        [job]
        name = "digits"
        code = "code"
        command = "python3 a.py"
        python = "/usr/bin/python3.11"
        workdir = "/srv/tfd"
        port = 3000
        env = { A = "1", B = "two" }
        setup = ["pip install x", "true"]
        secret_env = ["DB_URL"]
        [job.role_commands]
        chief = "python3 chief.py"
        [ssh]
        user = "ubuntu"
        port = 2200
        identity = "~/.ssh/id"
        jump = "bastion"
        host_keys = "accept-new"
        known_hosts = "~/.ssh/kh"
        connect_timeout = 3
        [[hosts]]
        name = "gpu1"
        address = "203.0.113.1"
        tf_address = "10.0.0.1"
        port = 4000
        gpus = 2
        share_gpus = true
        python = "python3.12"
        workdir = "/data/tfd"
        ssh = { user = "root", port = 22, host_keys = "strict" }
        tasks = [
          { role = "chief", gpus = [0, 1], command = "python3 c.py", env = { C = "3" } },
          { role = "worker", count = 3 },
        ]
        [[hosts]]
        address = "203.0.113.2"
        tasks = [{ role = "ps" }]
        """,
    )
    job = inv.job
    assert job.python == "/usr/bin/python3.11" and job.workdir == "/srv/tfd" and job.port == 3000
    assert job.env == {"A": "1", "B": "two"}
    assert job.setup == ("pip install x", "true")
    assert job.secret_env == ("DB_URL",)
    assert job.role_commands == {"ps": BUILTIN_SERVER, "chief": "python3 chief.py"}
    gpu1, other = inv.hosts
    assert (gpu1.name, gpu1.address, gpu1.tf_address, gpu1.port, gpu1.gpus) == (
        "gpu1",
        "203.0.113.1",
        "10.0.0.1",
        4000,
        2,
    )
    assert (gpu1.share_gpus, gpu1.python, gpu1.workdir) == (True, "python3.12", "/data/tfd")
    # The host's own `port` is its first TF port; its ssh table overrides [ssh] key by key.
    assert gpu1.ssh == SSHSettings(
        user="root",
        port=22,
        identity="~/.ssh/id",
        jump="bastion",
        host_keys="strict",
        known_hosts="~/.ssh/kh",
        connect_timeout=3.0,
    )
    assert other.ssh == SSHSettings(
        user="ubuntu",
        port=2200,
        identity="~/.ssh/id",
        jump="bastion",
        host_keys="accept-new",
        known_hosts="~/.ssh/kh",
        connect_timeout=3.0,
    )
    assert (other.name, other.port, other.python, other.workdir) == (
        "203.0.113.2",
        3000,
        "/usr/bin/python3.11",
        "/srv/tfd",
    )
    assert gpu1.tasks == (
        TaskSpec(
            role="chief",
            gpus=(0, 1),
            command="python3 c.py",
            env={"C": "3"},
            key="hosts[0].tasks[0]",
        ),
        TaskSpec(role="worker", count=3, key="hosts[0].tasks[1]"),
    )


def test_code_is_relative_to_the_inventory_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    (tmp_path / "deep" / "src").mkdir()
    path = write_toml(sub, ONE_HOST.replace('code = "code"', 'code = "../src"'))
    monkeypatch.chdir(tmp_path)
    assert load_inventory(path.relative_to(tmp_path)).job.code == (tmp_path / "deep" / "src")


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        pytest.param(
            ONE_HOST.replace('command = "python3 train.py"', 'comand = "x"'),
            "job.comand: unknown key (known keys here: allow_mixed_tensorflow, artifacts, "
            "artifacts_to, checkpoint_dir, code, command, "
            "container_mounts, container_runtime, "
            "env, evaluator_failure, evaluator_grace, fanout, firewall, forward_env, framework, "
            "gpu_idle_stop, image, image_from, installer, keeper, lease_seconds, max_restarts, "
            "name, netcheck, notify, on_failure, port, profiler, profiler_port, python, "
            "require_tensorflow, requirements, restart_backoff, retry_exit_codes, role_commands, "
            "role_frameworks, role_images, role_requirements, "
            "secret_env, setup, stall_timeout, start_timeout, stop_grace, strategy, "
            "system_site_packages, tensorboard, wheels_from, workdir)",
            "did you mean 'command'?",
            id="unknown-job-key",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", gpu = [0] }'),
            "hosts[0].tasks[0].gpu: unknown key "
            "(known keys here: command, count, cpus, env, gpus, role, threads)",
            "did you mean 'gpus'?",
            id="unknown-task-key",
        ),
        pytest.param(
            ONE_HOST + '[ssh]\nusr = "me"\n',
            "ssh.usr: unknown key (known keys here: connect_timeout, host_keys, identity, jump, "
            "known_hosts, port, ssh_config, user)",
            "did you mean 'user'?",
            id="unknown-ssh-key",
        ),
        pytest.param(
            ONE_HOST + "[extra]\n",
            "extra: unknown key (known keys here: hosts, job, ssh)",
            None,
            id="unknown-top-level-no-suggestion",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'adress = "10.0.0.1"'),
            "hosts[0].address: is missing: expected a string",
            "found 'adress': did you mean 'address'?",
            id="misspelt-required-key",
        ),
        pytest.param(
            ONE_HOST.replace("[job]", "[jobs]"),
            "job: is missing: expected a table",
            "found 'jobs': did you mean 'job'?",
            id="misspelt-job-table",
        ),
        pytest.param(
            JOB,
            "hosts: is missing: expected a list",
            None,
            id="no-hosts",
        ),
        pytest.param(
            "hosts = []\n" + JOB,
            "hosts: expected at least one entry",
            None,
            id="empty-hosts",
        ),
        pytest.param(
            JOB + '[[hosts]]\naddress = "h"\ntasks = []\n',
            "hosts[0].tasks: expected at least one entry",
            None,
            id="empty-tasks",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'address = "h"\ngpus = "4"'),
            "hosts[0].gpus: expected an integer or \"auto\" (count with nvidia-smi), got '4'",
            None,
            id="gpus-wrong-type",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'address = "h"\ngpus = 100000'),
            "hosts[0].gpus: expected an integer of at least 0 and at most 1024, got 100000",
            None,
            id="gpus-too-many",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'address = "h"\nshare_gpus = 1'),
            "hosts[0].share_gpus: expected true or false, got number 1",
            None,
            id="bool-wrong-type",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", gpus = [0, "1"] }'),
            "hosts[0].tasks[0].gpus[1]: expected a GPU index (an integer >= 0), got string '1'",
            None,
            id="gpu-index-wrong-type",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", gpus = [-1] }'),
            "hosts[0].tasks[0].gpus[0]: expected a GPU index (an integer >= 0), got number -1",
            None,
            id="gpu-index-negative",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", gpus = [1, 1] }'),
            "hosts[0].tasks[0].gpus: lists an entry twice: [1, 1]",
            None,
            id="gpu-index-twice",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", gpus = 0 }'),
            "hosts[0].tasks[0].gpus: expected a list, got number 0",
            None,
            id="gpus-not-a-list",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "master" }'),
            "hosts[0].tasks[0].role: expected one of chief, worker, ps, evaluator, got 'master'",
            None,
            id="unknown-role",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', "{ count = 2 }"),
            "hosts[0].tasks[0].role: is missing: expected a string",
            None,
            id="missing-role",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "worker", count = 0 }'),
            "hosts[0].tasks[0].count: expected an integer of at least 1 and at most 1024, got 0",
            None,
            id="count-zero",
        ),
        pytest.param(
            ONE_HOST.replace('tasks = [{ role = "chief" }]', 'tasks = ["chief"]'),
            "hosts[0].tasks[0]: expected a table, got string 'chief'",
            None,
            id="task-not-a-table",
        ),
        pytest.param(
            JOB + 'env = { A = "1", N = 5 }\n' + ONE_HOST.removeprefix(JOB),
            "job.env.N: expected a string, got number 5",
            'quote the value, e.g. NAME = "1"',
            id="env-not-a-string",
        ),
        pytest.param(
            ONE_HOST.replace('{ role = "chief" }', '{ role = "chief", env = { X = true } }'),
            "hosts[0].tasks[0].env.X: expected a string, got boolean true",
            'quote the value, e.g. NAME = "1"',
            id="task-env-not-a-string",
        ),
        pytest.param(
            JOB + 'setup = ["ok", 3]\n' + ONE_HOST.removeprefix(JOB),
            "job.setup[1]: expected a string, got number 3",
            None,
            id="setup-item",
        ),
        pytest.param(
            ONE_HOST.replace('code = "code"', 'code = "nowhere"'),
            "job.code: expected a directory, but {tmp}/nowhere does not exist or is not a "
            "directory",
            None,
            id="code-dir-missing",
        ),
        pytest.param(
            ONE_HOST.replace('code = "code"', 'code = "inventory.toml"'),
            "job.code: expected a directory, but {tmp}/inventory.toml does not exist or is not "
            "a directory",
            None,
            id="code-is-a-file",
        ),
        pytest.param(
            ONE_HOST.replace('name = "j"', 'name = "a/b"'),
            "job.name: expected a job name of letters, digits and . _ -, got 'a/b'",
            None,
            id="job-name-slash",
        ),
        pytest.param(
            ONE_HOST.replace('name = "j"', 'name = "a..b"'),
            "job.name: expected a job name of letters, digits and . _ -, got 'a..b'",
            None,
            id="job-name-dotdot",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'address = "h"\nname = "-x"'),
            "hosts[0].name: expected a name of letters, digits and . _ - : @, got '-x'",
            None,
            id="host-name-leading-dash",
        ),
        pytest.param(
            ONE_HOST.replace('name = "j"', 'name = "  "'),
            "job.name: expected a non-empty string",
            None,
            id="blank-string",
        ),
        pytest.param(
            ONE_HOST + '[ssh]\nhost_keys = "yes"\n',
            "ssh.host_keys: expected 'strict' or 'accept-new', got 'yes'",
            None,
            id="host-keys-choice",
        ),
        pytest.param(
            ONE_HOST.replace('address = "10.0.0.1"', 'address = "h"\nssh = { port = 0 }'),
            "hosts[0].ssh.port: expected an integer of at least 1 and at most 65535, got 0",
            None,
            id="host-ssh-port",
        ),
        pytest.param(
            ONE_HOST + "[ssh]\nconnect_timeout = nan\n",
            "ssh.connect_timeout: expected a finite number, got nan",
            None,
            id="nan",
        ),
        pytest.param(
            ONE_HOST + "[ssh]\nconnect_timeout = 0.01\n",
            "ssh.connect_timeout: expected a number of at least 0.1, got 0.01",
            None,
            id="number-minimum",
        ),
        pytest.param(
            ONE_HOST.replace("[job]", "[job]\nport = 70000"),
            "job.port: expected an integer of at least 1 and at most 65535, got 70000",
            None,
            id="job-port-range",
        ),
        pytest.param(
            ONE_HOST.replace("[job]", '[job]\nrole_commands = { master = "x" }'),
            "job.role_commands.master: expected one of the roles chief, worker, ps, evaluator",
            None,
            id="role-command-unknown-role",
        ),
        pytest.param(
            ONE_HOST.replace("[job]", '[job]\nrole_commands = { evaluator = "tfdeploy:server" }'),
            "job.role_commands.evaluator: an evaluator runs the user's code, not a TF server",
            None,
            id="evaluator-server",
        ),
        pytest.param(
            ONE_HOST + '[[hosts]]\nname = "10.0.0.1"\naddress = "b"\ntasks = [{role = "ps"}]\n',
            "hosts[1].name: duplicate host name '10.0.0.1' (also hosts[0])",
            None,
            id="duplicate-name",
        ),
        pytest.param(
            ONE_HOST + '[[hosts]]\nname = "b"\naddress = "10.0.0.1"\ntasks = [{role = "ps"}]\n',
            "hosts[1].address: 10.0.0.1 port 22 is already listed as hosts[0]",
            "list a host once and give it several tasks instead",
            id="duplicate-address-port",
        ),
    ],
)
def test_mistakes_name_file_key_path_and_expectation(
    tmp_path: Path, text: str, message: str, hint: str | None
) -> None:
    err = error(tmp_path, text)
    expected = message.replace("{tmp}", str(tmp_path.resolve()))
    assert err.message == f"{tmp_path / 'inventory.toml'}: {expected}"
    assert err.hint == hint


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    err = error(tmp_path, ONE_HOST + "[[hosts]\n")
    assert err.key == ""
    assert err.message == (
        f"{tmp_path / 'inventory.toml'}: invalid TOML: "
        "Expected ']]' at the end of an array declaration (at line 9, column 8)"
    )


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b'[job]\nname = "\xff"\n')
    with pytest.raises(InventoryError, match=r"bin\.toml: is not UTF-8 text$"):
        load_inventory(path)
    with pytest.raises(InventoryError, match=r"nope\.toml: file not found$"):
        load_inventory(tmp_path / "nope.toml")


def test_same_address_with_other_ssh_port_is_another_host(tmp_path: Path) -> None:
    inv = load(
        tmp_path,
        ONE_HOST
        + '[[hosts]]\nname = "b"\naddress = "10.0.0.1"\nssh = { port = 2200 }\n'
        + 'port = 3000\ntasks = [{role = "ps"}]\n',
    )
    assert [(h.name, h.ssh.port, h.port) for h in inv.hosts] == [
        ("10.0.0.1", 22, 2222),
        ("b", 2200, 3000),
    ]


@pytest.mark.parametrize("name", ["a:b", "me@x", "..", "-x", "a/b"])
def test_job_names_are_safe_in_run_ids(tmp_path: Path, name: str) -> None:
    """The job name starts every run id, which is a directory name on every host."""
    path = write_toml(tmp_path, ONE_HOST.replace('name = "j"', f'name = "{name}"'))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.key == "job.name"
    assert "expected a job name of letters, digits and . _ -" in caught.value.message
