"""Planning stays near-linear: a plan of n tasks must not hold n copies of the n-task cluster."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from deployer.config.inventory import Inventory
from deployer.config.plan import make_plan
from tests.support.helpers import JOB, load


def fleet(tmp_path: Path, hosts: int) -> Inventory:
    """One chief, then workers and every tenth host a ps: the shape of a large PSS job."""
    text = [JOB]
    for i in range(hosts):
        role = "chief" if i == 0 else ("ps" if i % 10 == 1 else "worker")
        address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        text.append(f'[[hosts]]\naddress = "{address}"\ntasks = [{{ role = "{role}" }}]\n')
    folder = tmp_path / str(hosts)
    folder.mkdir()
    return load(folder, "".join(text))


def planning_peak(inventory: Inventory) -> int:
    tracemalloc.start()
    try:
        make_plan(inventory)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_planning_memory_grows_linearly_with_the_hosts(tmp_path: Path) -> None:
    small, large = fleet(tmp_path, 1000), fleet(tmp_path, 2000)
    peak_small, peak_large = planning_peak(small), planning_peak(large)
    # Measured: 1.4 and 2.8 MB; holding a TF_CONFIG per task took 20 and 78 MB (quadratic).
    assert peak_large < 10_000_000, peak_large
    assert peak_large / peak_small < 2.5, (peak_small, peak_large)


def test_every_task_still_gets_the_whole_cluster(tmp_path: Path) -> None:
    plan = make_plan(fleet(tmp_path, 300))
    worker = plan.task("worker:7")
    config = json.loads(worker.env["TF_CONFIG"])
    assert config == {"cluster": plan.cluster, "task": {"type": "worker", "index": 7}}
    assert worker.env["TF_CONFIG"] == json.dumps(config)
    assert len(plan.cluster["worker"]) == 269 and len(plan.cluster["ps"]) == 30
    assert [t.name for t in plan.tasks_on(worker.host)] == ["worker:7"]
