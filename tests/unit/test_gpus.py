"""GPUs: nvidia-smi facts, the re-plan for gpus = "auto", preflight errors and the view's column.

tests/fakes/nvidia-smi is a HARDWARE STAND-IN: a shell script printing canned CSV in nvidia-smi's
format; here the agent's op runs it from PATH on this machine (on lab hosts:
tests/integration/test_gpus.py).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deployer.config.inventory import parse_inventory
from deployer.config.plan import make_plan
from deployer.hosts.gpus import GpuApp, GpuReport, check_gpus, usage_text
from deployer.watch.board import TaskRow
from deployer.watch.table import TaskTable
from tests.support.gpus import FAKE, STATE_NAME, state, uuid

REMOTE = Path(__file__).resolve().parents[2] / "remote"


def report(n: int, apps: Sequence[tuple[int, int]] = (), util: Sequence[int] = ()) -> GpuReport:
    return GpuReport.from_json(
        {
            "nvidia_smi": "/usr/bin/nvidia-smi",
            "error": None,
            "gpus": [
                {
                    "index": i,
                    "uuid": uuid(i),
                    "name": "NVIDIA A10G",
                    "memory_total": 23028,
                    "memory_used": 2048,
                    "utilization": util[i] if i < len(util) else 0,
                }
                for i in range(n)
            ],
            "apps": [{"gpu_uuid": uuid(g), "pid": pid, "used_memory": 100} for g, pid in apps],
        }
    )


def plan_for(hosts: list[dict[str, Any]], tmp_path: Path) -> Any:
    data = {"job": {"name": "g", "code": str(tmp_path), "command": "x"}, "hosts": hosts}
    return make_plan(parse_inventory(data, tmp_path / "inv.toml"))


# -- the agent's op, on this machine with the stand-in on PATH ------------------------------------


def test_agent_op_parses_nvidia_smi_output(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE)
    (bin_dir / STATE_NAME).write_text(state(apps=[{"gpu": 2, "pid": 4242, "used_memory": 512}]))
    code = (
        f"import sys, json; sys.path.insert(0, {str(REMOTE)!r}); import agent; "
        'print(json.dumps(agent.handle(b\'{"v": 1, "op": "gpus", "workdir": "/tmp"}\')))'
    )
    env = os.environ | {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    got = GpuReport.from_json(__import__("json").loads(done.stdout))
    assert got.nvidia_smi == str(bin_dir / "nvidia-smi") and got.error is None
    assert [g.index for g in got.gpus] == [0, 1, 2, 3]
    assert got.gpus[1].memory_total == 23028 and got.gpus[1].name == "NVIDIA A10G"
    assert got.apps == (GpuApp(uuid(2), 4242, "python3", 512),)
    (bin_dir / STATE_NAME).write_text(state(fail=True))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    failed = GpuReport.from_json(__import__("json").loads(done.stdout))
    assert failed.error and "exited with code 9" in failed.error and "NVIDIA driver" in failed.error
    env["PATH"] = "/usr/bin:/bin"
    env["HOME"] = str(tmp_path / "nohome")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert GpuReport.from_json(__import__("json").loads(done.stdout)).nvidia_smi is None


def test_agent_drops_a_health_field_the_driver_does_not_know_and_asks_again(
    tmp_path: Path,
) -> None:
    """An older driver has no row remapping: nvidia-smi refuses the whole query (exit 2) for
    one unknown field; the agent leaves that field out and still gets every GPU's health."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE)
    unknown = ["remapped_rows.pending", "remapped_rows.failure"]
    pending = {1: {"retired_pages.pending": "Yes"}}
    (bin_dir / STATE_NAME).write_text(state(2, gpus=pending, unsupported=unknown))
    code = (
        f"import sys, json; sys.path.insert(0, {str(REMOTE)!r}); import agent; "
        'print(json.dumps(agent.handle(b\'{"v": 1, "op": "gpus", "workdir": "/tmp"}\')))'
    )
    env = os.environ | {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    got = GpuReport.from_json(__import__("json").loads(done.stdout))
    assert got.error is None, got.error
    assert [g.index for g in got.gpus] == [0, 1]
    assert set(got.gpus[1].health) == {
        "ecc.errors.uncorrected.volatile.total",
        "retired_pages.pending",
        "mig.mode.current",
    }
    assert got.gpus[1].health["retired_pages.pending"] == "Yes"  # the rest is still read


# -- pure checks --------------------------------------------------------------------------------


def test_auto_counts_gpus_and_replans_the_split(tmp_path: Path) -> None:
    plan = plan_for(
        [
            {
                "address": "a",
                "gpus": "auto",
                "tasks": [{"role": "worker", "count": 2}, {"role": "ps"}],
            },
            {"address": "b", "gpus": 2, "tasks": [{"role": "worker", "gpus": [1]}]},
        ],
        tmp_path,
    )
    assert [t.gpus for t in plan.tasks] == [(), (), (), (1,)]  # a's count is unknown yet
    new, problems, warnings = check_gpus(plan, {"a": report(5), "b": report(2)})
    assert problems == [] and warnings == []
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in new.tasks] == ["0,1,2", "3,4", "", "1"]


def test_preflight_problems_name_the_host(tmp_path: Path) -> None:
    plan = plan_for(
        [
            {"address": "nosmi", "gpus": "auto", "tasks": [{"role": "worker"}]},
            {"address": "small", "gpus": 8, "tasks": [{"role": "worker"}]},
            {"address": "idx", "gpus": "auto", "tasks": [{"role": "chief", "gpus": [4]}]},
            {"address": "cpu", "tasks": [{"role": "ps"}]},
        ],
        tmp_path,
    )
    no_smi = GpuReport(nvidia_smi=None, error=None, gpus=(), apps=())
    _, problems, _ = check_gpus(
        plan, {"nosmi": no_smi, "small": report(4), "idx": report(4), "cpu": no_smi}
    )
    messages = [p.message for p in problems]
    assert messages == [
        'nosmi: GPUs were requested (gpus = "auto") but nvidia-smi was not found on the host',
        "small: gpus = 8 but nvidia-smi lists 4 GPU(s): indices 0, 1, 2, 3",
        "idx: hosts[2].tasks[0].gpus: GPU 4 does not exist: nvidia-smi lists 4 GPU(s): "
        "indices 0, 1, 2, 3",
    ]
    assert problems[0].hint and "NVIDIA driver" in problems[0].hint


def test_busy_gpu_is_refused_unless_allowed_and_shared_gpu_is_an_error(tmp_path: Path) -> None:
    plan = plan_for([{"address": "a", "gpus": "auto", "tasks": [{"role": "worker"}]}], tmp_path)
    _, problems, warnings = check_gpus(plan, {"a": report(2, apps=[(1, 777)])})
    busy = (
        f"a: GPU 1 (NVIDIA A10G, {uuid(1)}), given to worker:0, already runs compute process(es) "
        "pid 777 (?, 100 MiB)"
    )
    assert [p.message for p in problems] == [busy] and warnings == []
    assert problems[0].hint and "allow_busy_gpus" in problems[0].hint
    allowed = plan_for(
        [{"address": "a", "gpus": "auto", "allow_busy_gpus": True, "tasks": [{"role": "worker"}]}],
        tmp_path,
    )
    _, problems, warnings = check_gpus(allowed, {"a": report(2, apps=[(1, 777)])})
    assert not problems and warnings == [f"{busy} (allow_busy_gpus = true)"]
    from deployer.core.errors import InventoryError

    two = [{"role": "worker", "gpus": [0]}, {"role": "worker", "gpus": [0]}]
    with pytest.raises(InventoryError, match="GPU 0 would be shared"):
        plan_for([{"address": "a", "gpus": "auto", "tasks": two}], tmp_path)
    shared = plan_for(
        [{"address": "a", "gpus": "auto", "share_gpus": True, "tasks": two}], tmp_path
    )
    assert not check_gpus(shared, {"a": report(1)})[1]


def test_health_rules_name_host_gpu_and_reason_and_na_is_no_error(tmp_path: Path) -> None:
    plan = plan_for(
        [
            {"address": "a", "gpus": "auto", "tasks": [{"role": "worker", "count": 6}]},
            {"address": "b", "gpus": "auto", "max_ecc_errors": 3, "tasks": [{"role": "worker"}]},
            {"address": "c", "gpus": "auto", "gpu_health": "warn", "tasks": [{"role": "worker"}]},
        ],
        tmp_path,
    )
    a = with_gpus(
        report(7),
        {
            1: {"ecc.errors.uncorrected.volatile.total": "2"},
            2: {"retired_pages.pending": "Yes"},
            3: {"remapped_rows.pending": "Yes", "remapped_rows.failure": "Yes"},
            4: {"mig.mode.current": "Enabled"},
            5: {"ecc.errors.uncorrected.volatile.total": "[N/A]", "retired_pages.pending": "[N/A]"},
        },
        problems={6: "[GPU requires reset]"},
    )
    b = with_gpus(report(1), {0: {"ecc.errors.uncorrected.volatile.total": "3"}}, driver="535.1")
    c = with_gpus(report(1), {0: {"retired_pages.pending": "Yes"}})
    _, problems, warnings = check_gpus(plan, {"a": a, "b": b, "c": c})
    assert [p.message for p in problems] == [
        f"a: GPU 1 (NVIDIA A10G, {uuid(1)}): 2 uncorrectable ECC error(s) since the driver loaded "
        "(max_ecc_errors = 0)",
        f"a: GPU 2 (NVIDIA A10G, {uuid(2)}): retired pages are pending (the GPU needs a reset to "
        "retire them)",
        f"a: GPU 3 (NVIDIA A10G, {uuid(3)}): row remapping is pending (the GPU needs a reset); "
        "row remapping failed (the GPU should be replaced)",
        f"a: GPU 6 (NVIDIA A10G, {uuid(6)}): nvidia-smi reports [GPU requires reset]",
    ]
    assert warnings == [
        f"a: GPU 4 (NVIDIA A10G, {uuid(4)}) has MIG mode on: CUDA_VISIBLE_DEVICES=4 gives its "
        "task one MIG instance, not the whole GPU",
        f"c: GPU 0 (NVIDIA A10G, {uuid(0)}): retired pages are pending (the GPU needs a reset to "
        'retire them) (gpu_health = "warn")',
        "the hosts' NVIDIA driver versions differ: a 550.54.15; b 535.1; c 550.54.15",
    ]


def with_gpus(
    r: GpuReport,
    health: dict[int, dict[str, str]],
    *,
    problems: dict[int, str] | None = None,
    driver: str = "550.54.15",
) -> GpuReport:
    import dataclasses

    gpus = tuple(
        dataclasses.replace(
            g,
            driver_version=driver,
            health=health.get(g.index, {}),
            problem=(problems or {}).get(g.index),
        )
        for g in r.gpus
    )
    return dataclasses.replace(r, gpus=gpus)


def test_usage_text_and_the_view_column(tmp_path: Path) -> None:
    plan = plan_for(
        [{"address": "a", "gpus": 4, "tasks": [{"role": "worker", "count": 2}]}], tmp_path
    )
    r = report(4, util=[40, 60, 0, 100])
    assert usage_text(plan.tasks[0], r) == "50% 4.0/45.0 GiB"
    assert usage_text(plan.tasks[1], r) == "50% 4.0/45.0 GiB"
    assert usage_text(plan.tasks[0], None) == ""

    def render(rows: list[TaskRow]) -> str:
        console = Console(file=io.StringIO(), width=140, color_system=None)
        console.print(TaskTable(rows, now=100.0))
        return console.file.getvalue()  # type: ignore[attr-defined]

    with_use = render([TaskRow("worker:0", "a", "running", 7, "0,1", "50% 4.0/45.0 GiB", 90.0)])
    assert "GPU use" in with_use and "50% 4.0/45.0 GiB" in with_use
    assert "GPU use" not in render([TaskRow("worker:0", "a", "running", 7, "0,1")])
