"""Planning rules: task indices, ports, GPU masks, commands, environment and the exact TF_CONFIG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.api.render import plan_document, plan_table
from deployer.config.plan import RESERVED_ENV
from remote import protocol
from tests.support.helpers import JOB, plan, plan_error, tf_config

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

PSS = (
    JOB
    + """
[job.role_commands]
worker = "tfdeploy:server"

[[hosts]]
name = "gpu1"
address = "203.0.113.11"
tf_address = "10.0.0.11"
gpus = 4
tasks = [{ role = "chief", gpus = [0] }, { role = "worker", gpus = [1, 2, 3] }]

[[hosts]]
name = "gpu2"
address = "203.0.113.12"
tf_address = "10.0.0.12"
gpus = 4
tasks = [{ role = "worker", count = 2 }]

[[hosts]]
name = "cpu1"
address = "203.0.113.13"
tf_address = "10.0.0.13"
tasks = [{ role = "ps", count = 2 }]
"""
)


def rows(p: object) -> list[tuple[str, str, int | None, str, str]]:
    return [
        (t.name, t.host, t.port, t.env["CUDA_VISIBLE_DEVICES"], t.command)
        for t in p.tasks  # type: ignore[attr-defined]
    ]


def test_pss_layout_exact_tf_config(tmp_path: Path) -> None:
    p = plan(tmp_path, PSS)
    assert rows(p) == [
        ("chief:0", "gpu1", 2222, "0", "python3 train.py"),
        ("worker:0", "gpu1", 2223, "1,2,3", "tfdeploy:server"),
        ("worker:1", "gpu2", 2222, "0,1", "tfdeploy:server"),
        ("worker:2", "gpu2", 2223, "2,3", "tfdeploy:server"),
        ("ps:0", "cpu1", 2222, "", "tfdeploy:server"),
        ("ps:1", "cpu1", 2223, "", "tfdeploy:server"),
    ]
    cluster = (
        '{"chief": ["10.0.0.11:2222"], '
        '"worker": ["10.0.0.11:2223", "10.0.0.12:2222", "10.0.0.12:2223"], '
        '"ps": ["10.0.0.13:2222", "10.0.0.13:2223"]}'
    )
    assert p.task("chief:0").env["TF_CONFIG"] == (
        '{"cluster": ' + cluster + ', "task": {"type": "chief", "index": 0}}'
    )
    assert p.task("worker:2").env["TF_CONFIG"] == (
        '{"cluster": ' + cluster + ', "task": {"type": "worker", "index": 2}}'
    )
    assert p.task("ps:1").env["TF_CONFIG"] == (
        '{"cluster": ' + cluster + ', "task": {"type": "ps", "index": 1}}'
    )
    assert p.cluster == json.loads(cluster)
    assert [t.address for t in p.tasks] == ["10.0.0.11"] * 2 + ["10.0.0.12"] * 2 + ["10.0.0.13"] * 2


def test_mwms_workers_only_omits_absent_roles(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB
        + """
        [[hosts]]
        address = "a"
        tasks = [{ role = "worker" }]
        [[hosts]]
        address = "b"
        port = 5000
        tasks = [{ role = "worker" }]
        """,
    )
    assert p.task("worker:1").env["TF_CONFIG"] == (
        '{"cluster": {"worker": ["a:2222", "b:5000"]}, "task": {"type": "worker", "index": 1}}'
    )
    assert tf_config(p, "worker:0") == {
        "cluster": {"worker": ["a:2222", "b:5000"]},
        "task": {"type": "worker", "index": 0},
    }


def test_evaluator_is_only_in_its_own_cluster_dict_and_takes_no_port(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB
        + """
        [[hosts]]
        address = "a"
        tasks = [{ role = "chief" }, { role = "evaluator" }, { role = "worker", count = 2 }]
        """,
    )
    assert [(t.name, t.port) for t in p.tasks] == [
        ("chief:0", 2222),
        ("evaluator:0", None),
        ("worker:0", 2223),
        ("worker:1", 2224),
    ]
    cluster = {"chief": ["a:2222"], "worker": ["a:2223", "a:2224"]}
    # TF reads cluster_spec["evaluator"] on an evaluator task (MWMS: KeyError without it); it is
    # its own cluster, at port 0 (no TF port), and no other task lists it (a PSS chief would wait).
    assert tf_config(p, "evaluator:0") == {
        "cluster": {"evaluator": ["a:0"]},
        "task": {"type": "evaluator", "index": 0},
    }
    assert tf_config(p, "chief:0") == {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    for name in ("worker:0", "worker:1"):
        assert tf_config(p, name)["cluster"] == cluster
    assert "evaluator" not in p.cluster


def test_an_ipv6_evaluator_lists_itself_bracketed(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB + '[[hosts]]\naddress = "::1"\ntasks = [{ role = "worker" }, { role = "evaluator" }]\n',
    )
    assert tf_config(p, "evaluator:0")["cluster"] == {"evaluator": ["[::1]:0"]}


def test_indices_follow_host_then_task_order_with_count_expanded_in_place(
    tmp_path: Path,
) -> None:
    p = plan(
        tmp_path,
        JOB
        + """
        [[hosts]]
        address = "a"
        tasks = [{ role = "worker", count = 2 }, { role = "ps" }, { role = "worker" }]
        [[hosts]]
        address = "b"
        port = 3000
        tasks = [{ role = "ps", count = 2 }, { role = "chief" }, { role = "worker" }]
        """,
    )
    assert [(t.name, t.host, t.port) for t in p.tasks] == [
        ("worker:0", "a", 2222),
        ("worker:1", "a", 2223),
        ("ps:0", "a", 2224),
        ("worker:2", "a", 2225),
        ("ps:1", "b", 3000),
        ("ps:2", "b", 3001),
        ("chief:0", "b", 3002),
        ("worker:3", "b", 3003),
    ]
    assert p.cluster == {
        "chief": ["b:3002"],
        "worker": ["a:2222", "a:2223", "a:2225", "b:3003"],
        "ps": ["a:2224", "b:3000", "b:3001"],
    }


@pytest.mark.parametrize(
    ("host", "tasks", "expected"),
    [
        # the free GPUs split evenly in contiguous blocks, the remainder to the first
        ("gpus = 8", '{ role = "worker", count = 3 }', ["0,1,2,3", "4,5", "6,7"]),
        ("gpus = 4", '{ role = "worker", count = 2 }', ["0,1", "2,3"]),
        # named GPUs leave the pool; ps gets none unless it names some
        (
            "gpus = 4",
            '{ role = "ps" }, { role = "chief", gpus = [2] }, { role = "worker", count = 2 }',
            ["", "2", "0,1", "3"],
        ),
        ("gpus = 2", '{ role = "ps", gpus = [1] }, { role = "worker" }', ["1", "0"]),
        # more tasks than GPUs: the later ones get none
        ("gpus = 1", '{ role = "worker", count = 3 }', ["0", "", ""]),
        # no GPUs declared: nothing, but named indices are taken as given
        ("", '{ role = "worker" }, { role = "worker", gpus = [5, 7] }', ["", "5,7"]),
        # an explicit empty list means no GPU
        ("gpus = 2", '{ role = "chief", gpus = [] }, { role = "worker" }', ["", "0,1"]),
        # evaluators take GPUs like workers
        ("gpus = 3", '{ role = "worker" }, { role = "evaluator" }', ["0,1", "2"]),
        # share_gpus lets tasks name the same GPU
        (
            "gpus = 2\nshare_gpus = true",
            '{ role = "worker", gpus = [0, 1], count = 2 }, { role = "worker" }',
            ["0,1", "0,1", ""],
        ),
    ],
)
def test_cuda_visible_devices(tmp_path: Path, host: str, tasks: str, expected: list[str]) -> None:
    p = plan(tmp_path, JOB + f'[[hosts]]\naddress = "a"\n{host}\ntasks = [{tasks}]\n')
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in p.tasks] == expected
    assert [",".join(map(str, t.gpus)) for t in p.tasks] == expected


def test_placeholders_and_literal_braces(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB.replace(
            'command = "python3 train.py"',
            'command = "t.py --job={task_type} --i={task_index} --c={chief_hosts} '
            '--w={worker_hosts} --p={ps_hosts} --x={{literal}}"',
        )
        + """
        [job.role_commands]
        ps = "ps.py {task_index} {ps_hosts}"
        [[hosts]]
        address = "a"
        tasks = [{ role = "worker", count = 2 }, { role = "ps" }]
        [[hosts]]
        address = "b"
        tasks = [{ role = "chief" }, { role = "worker", command = "own.py {task_index}" }]
        """,
    )
    assert [t.command for t in p.tasks] == [
        "t.py --job=worker --i=0 --c=b:2222 --w=a:2222,a:2223,b:2223 --p=a:2224 --x={literal}",
        "t.py --job=worker --i=1 --c=b:2222 --w=a:2222,a:2223,b:2223 --p=a:2224 --x={literal}",
        "ps.py 0 a:2224",
        "t.py --job=chief --i=0 --c=b:2222 --w=a:2222,a:2223,b:2223 --p=a:2224 --x={literal}",
        "own.py 2",
    ]


def test_absent_roles_give_empty_host_lists(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB.replace('"python3 train.py"', '"t.py [{chief_hosts}] [{ps_hosts}]"')
        + '[[hosts]]\naddress = "a"\ntasks = [{ role = "worker" }]\n',
    )
    assert p.task("worker:0").command == "t.py [] []"


def test_command_precedence(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB
        + """
        [job.role_commands]
        worker = "role.py"
        [[hosts]]
        address = "a"
        tasks = [
          { role = "chief" },
          { role = "worker" },
          { role = "worker", command = "task.py" },
          { role = "ps" },
        ]
        """,
    )
    assert [t.command for t in p.tasks] == [
        "python3 train.py",
        "role.py",
        "task.py",
        "tfdeploy:server",
    ]
    assert [t.awaited for t in p.tasks] == [True, True, True, False]


def test_env_is_merged_and_tfdeploy_adds_its_own(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB
        + """
        env = { A = "job", B = "job" }
        [[hosts]]
        address = "a"
        tasks = [{ role = "worker", env = { B = "task", C = "3" } }, { role = "worker" }]
        """,
    )
    w0, w1 = p.tasks
    assert w0.env == {
        "A": "job",
        "B": "task",
        "C": "3",
        "TF_CONFIG": w0.env["TF_CONFIG"],
        "CUDA_VISIBLE_DEVICES": "",
        "TFDEPLOY_TASK": "worker:0",
    }
    assert {k: v for k, v in w1.env.items() if k != "TF_CONFIG"} == {
        "A": "job",
        "B": "job",
        "CUDA_VISIBLE_DEVICES": "",
        "TFDEPLOY_TASK": "worker:1",
    }


HOST_A = '[[hosts]]\naddress = "a"\n'


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "chief" }, { role = "chief" }]\n',
            "hosts[0].tasks[1].role: at most one chief per job, found 2",
            "make the others workers",
            id="two-chiefs",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "chief", count = 2 }]\n',
            "hosts[0].tasks[0].role: at most one chief per job, found 2",
            "make the others workers",
            id="chief-count-2",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "ps" }, { role = "evaluator" }]\n',
            "hosts: expected at least one task with role chief or worker",
            None,
            id="no-chief-or-worker",
        ),
        pytest.param(
            JOB + HOST_A + 'gpus = 2\ntasks = [{ role = "worker", gpus = [0, 2] }]\n',
            "hosts[0].tasks[0].gpus: GPU 2 does not exist: host 'a' has 2 GPU(s), indices 0-1",
            None,
            id="gpu-index-out-of-range",
        ),
        pytest.param(
            JOB
            + HOST_A
            + "gpus = 4\n"
            + 'tasks = [{ role = "chief", gpus = [0, 1] }, { role = "worker", gpus = [1] }]\n',
            "hosts[0].tasks[1].gpus: GPU 1 would be shared by this task and hosts[0].tasks[0]",
            "give each task its own GPUs, or set share_gpus = true on hosts[0]",
            id="overlapping-gpus",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "worker", gpus = [3], count = 2 }]\n',
            "hosts[0].tasks[0].gpus: GPU 3 would be shared by the 2 copies of this task",
            "give each task its own GPUs, or set share_gpus = true on hosts[0]",
            id="copies-share-gpus",
        ),
        pytest.param(
            JOB
            + HOST_A
            + 'tasks = [{ role = "chief" }]\n'
            + '[[hosts]]\nname = "b"\naddress = "b"\ntf_address = "a"\n'
            + 'tasks = [{ role = "worker" }]\n',
            "hosts[1].port: port 2222 on a is given to both chief:0 on host 'a' and worker:0 on "
            "host 'b'",
            "give one of the hosts another port range (port = ...)",
            id="port-clash",
        ),
        pytest.param(
            JOB + HOST_A + 'port = 65535\ntasks = [{ role = "worker", count = 2 }]\n',
            "hosts[0].port: worker:1 on host 'a' would get port 65536, above 65535",
            None,
            id="port-above-65535",
        ),
        pytest.param(
            JOB.replace("train.py", "train.py {task_idx}")
            + HOST_A
            + 'tasks = [{ role = "worker" }]\n',
            "job.command: unknown placeholder {task_idx}; known: {task_type}, {task_index}, "
            "{chief_hosts}, {worker_hosts}, {ps_hosts}",
            "write {{ and }} for literal braces",
            id="unknown-placeholder",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "worker", command = \'x {{"a": 1}\' }]\n',
            "hosts[0].tasks[0].command: malformed braces (Single '}' encountered in format string)",
            "write {{ and }} for literal braces",
            id="malformed-braces",
        ),
        pytest.param(
            JOB
            + '[job.role_commands]\nchief = "c.py {0}"\n'
            + HOST_A
            + 'tasks = [{role="chief"}]\n',
            "job.role_commands.chief: unknown placeholder {0}; known: {task_type}, {task_index}, "
            "{chief_hosts}, {worker_hosts}, {ps_hosts}",
            "write {{ and }} for literal braces",
            id="positional-placeholder",
        ),
        pytest.param(
            JOB.replace("train.py", "train.py {task_index:d}")
            + HOST_A
            + 'tasks = [{ role = "worker" }]\n',
            "job.command: placeholder {task_index} takes no format spec or conversion",
            "write {{ and }} for literal braces",
            id="format-spec",
        ),
        pytest.param(
            JOB.replace("train.py", "train.py {task_type!r}")
            + HOST_A
            + 'tasks = [{ role = "worker" }]\n',
            "job.command: placeholder {task_type} takes no format spec or conversion",
            "write {{ and }} for literal braces",
            id="conversion",
        ),
        pytest.param(
            JOB.replace('command = "python3 train.py"\n', "")
            + HOST_A
            + 'tasks = [{ role = "worker" }]\n',
            "hosts[0].tasks[0]: no command for this worker",
            "set job.command, job.role_commands.worker or command on this task",
            id="no-command",
        ),
        pytest.param(
            JOB + 'env = { TF_CONFIG = "{}" }\n' + HOST_A + 'tasks = [{ role = "worker" }]\n',
            "job.env.TF_CONFIG: TF_CONFIG is set by tfdeploy for each task",
            "remove it: tfdeploy builds it from the hosts and tasks of the inventory",
            id="reserved-env-job",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "worker", env = { CUDA_VISIBLE_DEVICES = "0" } }]\n',
            "hosts[0].tasks[0].env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by tfdeploy "
            "for each task",
            "remove it; use gpus = [...] to choose GPUs",
            id="reserved-env-task",
        ),
        pytest.param(
            JOB + 'env = { TFDEPLOY_RUN_ID = "x" }\n' + HOST_A + 'tasks = [{ role = "worker" }]\n',
            "job.env.TFDEPLOY_RUN_ID: TFDEPLOY_RUN_ID is set by tfdeploy for each task",
            "remove it: each run gets its own id",
            id="reserved-run-id",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "worker", env = { TFDEPLOY_TASK = "x" } }]\n',
            "hosts[0].tasks[0].env.TFDEPLOY_TASK: TFDEPLOY_TASK is set by tfdeploy for each task",
            "remove it: it names the task (role:index) the process runs",
            id="reserved-task",
        ),
        pytest.param(
            JOB + 'env = { TFDEPLOY_ATTEMPT = "0" }\n' + HOST_A + 'tasks = [{ role = "worker" }]\n',
            "job.env.TFDEPLOY_ATTEMPT: TFDEPLOY_ATTEMPT is set by tfdeploy for each task",
            'remove it: it counts the whole job\'s restarts (on_failure = "restart-job"), 0 first',
            id="reserved-attempt",
        ),
        pytest.param(
            JOB + HOST_A + 'tasks = [{ role = "worker", env = { TFDEPLOY_HOST_ID = "h" } }]\n',
            "hosts[0].tasks[0].env.TFDEPLOY_HOST_ID: TFDEPLOY_HOST_ID is set by tfdeploy for each "
            "task",
            "remove it: it names the host a task runs on, so that a stop never takes another "
            "host's processes",
            id="reserved-host-id",
        ),
        pytest.param(
            JOB
            + '[job.role_commands]\nchief = "tfdeploy:server"\nworker = "tfdeploy:server"\n'
            + HOST_A
            + 'tasks = [{ role = "chief" }, { role = "worker" }, { role = "evaluator" }]\n',
            "job.role_commands: every chief and worker runs the built-in server, so nothing "
            "would ever finish",
            "give the chief (or the workers) the training command",
            id="all-servers",
        ),
    ],
)
def test_plan_mistakes(tmp_path: Path, text: str, message: str, hint: str | None) -> None:
    err = plan_error(tmp_path, text)
    assert err.message == f"{tmp_path / 'inventory.toml'}: {message}"
    assert err.hint == hint


def test_every_name_tfdeploy_sets_in_a_task_is_refused_in_env(tmp_path: Path) -> None:
    """The protocol's list of task variables, every one refused in job.env and in a task's env:
    a name added there cannot be silently overwritten (TFDEPLOY_ATTEMPT once was)."""
    assert "TFDEPLOY_ATTEMPT" in protocol.TASK_ENV_NAMES
    for name in protocol.TASK_ENV_NAMES:
        err = plan_error(
            tmp_path,
            JOB + f'env = {{ {name} = "1" }}\n' + HOST_A + 'tasks = [{ role = "worker" }]\n',
        )
        assert err.message.endswith(f"job.env.{name}: {name} is set by tfdeploy for each task")
        assert err.hint == RESERVED_ENV[name]
    err = plan_error(
        tmp_path,
        JOB + 'forward_env = ["TFDEPLOY_ATTEMPT"]\n' + HOST_A + 'tasks = [{ role = "worker" }]\n',
    )  # copied from this machine, it would be overwritten just the same
    assert err.message.endswith(
        "job.forward_env: TFDEPLOY_ATTEMPT is set by tfdeploy for each task"
    )


def test_evaluators_do_not_clash_or_exhaust_ports(tmp_path: Path) -> None:
    p = plan(
        tmp_path,
        JOB + HOST_A + 'port = 65535\ntasks = [{ role = "worker" }, { role = "evaluator" }]\n',
    )
    assert [(t.name, t.port) for t in p.tasks] == [("worker:0", 65535), ("evaluator:0", None)]


SECRETS = (
    JOB
    + """
secret_env = ["DB_URL"]
[job.env]
WANDB_API_KEY = "k-123456"
HF_TOKEN = "t-123456"
DB_PASSWORD = "p-123456"
my_secret = "s-123456"
DB_URL = "postgres://u:pw@h"
PLAIN = "visible"
[[hosts]]
address = "a"
tasks = [{ role = "worker", env = { TASK_KEY = "tk-123456" } }]
"""
)


def test_secrets_are_masked_in_the_document(tmp_path: Path) -> None:
    doc = plan_document(plan(tmp_path, SECRETS))
    assert doc["job"]["env"] == {
        "WANDB_API_KEY": "********",
        "HF_TOKEN": "********",
        "DB_PASSWORD": "********",
        "my_secret": "********",
        "DB_URL": "********",
        "PLAIN": "visible",
    }
    env = doc["tasks"][0]["env"]
    assert {k: env[k] for k in env if k != "TF_CONFIG"} == {
        "WANDB_API_KEY": "********",
        "HF_TOKEN": "********",
        "DB_PASSWORD": "********",
        "my_secret": "********",
        "DB_URL": "********",
        "PLAIN": "visible",
        "TASK_KEY": "********",
        "CUDA_VISIBLE_DEVICES": "",
        "TFDEPLOY_TASK": "worker:0",
    }
    text = json.dumps(doc)
    for value in ("k-123456", "t-123456", "p-123456", "s-123456", "pw@h", "tk-123456"):
        assert value not in text


def test_secrets_never_reach_the_table(tmp_path: Path) -> None:
    from io import StringIO

    from rich.console import Console

    console = Console(width=200, color_system=None, file=StringIO())
    console.print(plan_table(plan(tmp_path, SECRETS)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "worker:0" in text
    for value in ("k-123456", "t-123456", "p-123456", "s-123456", "pw@h", "tk-123456"):
        assert value not in text
