"""CPU placement: `threads = N` sizes TF and OpenMP thread pools, `cpus` pins the task process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.config.inventory import load_inventory
from deployer.config.plan import make_plan, thread_env

THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def _plan(tmp_path: Path, tasks: str, job_env: str = "{}") -> Any:
    (tmp_path / "code").mkdir(exist_ok=True)
    inventory = tmp_path / "inv.toml"
    inventory.write_text(
        f'[job]\nname = "p"\ncode = "code"\ncommand = "python3 t.py"\nenv = {job_env}\n\n'
        f'[[hosts]]\naddress = "10.0.0.1"\ntasks = {tasks}\n'
    )
    return make_plan(load_inventory(inventory))


def test_threads_set_tf_and_openmp_pools(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[{ role = "worker", threads = 4, cpus = "0-3" }]')
    (task,) = plan.tasks
    assert [task.env[v] for v in THREAD_VARS] == ["4", "4", "4"]
    assert task.cpus == "0-3"


def test_one_thread_keeps_two_inter_op_threads() -> None:
    # TF_NUM_INTEROP_THREADS=1 deadlocks ParameterServerStrategy servers (TF 2.21).
    assert thread_env(1) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "2",
        "OMP_NUM_THREADS": "1",
    }


def test_no_threads_no_cpus_leave_tf_defaults(tmp_path: Path) -> None:
    (task,) = _plan(tmp_path, '[{ role = "worker" }]').tasks
    assert not set(THREAD_VARS) & set(task.env)
    assert task.cpus is None


def test_explicit_env_wins_over_threads(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[{ role = "worker", threads = 3 }]', '{ OMP_NUM_THREADS = "1" }')
    (task,) = plan.tasks
    assert task.env["OMP_NUM_THREADS"] == "1"
    assert task.env["TF_NUM_INTRAOP_THREADS"] == "3"


def test_pinned_tasks_keep_two_inter_op_threads(tmp_path: Path) -> None:
    # TF sizes its inter-op pool from the affinity mask: one CPU would make it 1 and hang PSS.
    one, four = _plan(
        tmp_path, '[{ role = "worker", cpus = "1" }, { role = "ps", cpus = "0-1,4-5" }]'
    ).tasks
    assert one.env["TF_NUM_INTEROP_THREADS"] == "2"
    assert four.env["TF_NUM_INTEROP_THREADS"] == "4"
    assert "TF_NUM_INTRAOP_THREADS" not in one.env
