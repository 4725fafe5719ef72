"""`tfdeploy plan` as a user runs it: table, JSON document, one message per mistake, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import deployer.api.deploy
from tests.support.helpers import one_line, run_cli

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

INVENTORIES = Path(__file__).parent.parent / "inventories"
GOOD = INVENTORIES / "good_pss.toml"
# The console script pip installed next to the Python running the tests (the user's venv), or,
# in a venv that holds the dependencies only (scripts/install.sh), the same main as a module.
_SCRIPT = Path(sys.executable).with_name("tfdeploy")
TFDEPLOY = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "deployer"]
BAD = sorted(INVENTORIES.glob("bad_*.toml"))


def expectation(path: Path) -> tuple[str, str | None]:
    """The `# expect:` and optional `# hint:` comment lines at the top of a bad_*.toml file."""
    expect, hint = "", None
    for line in path.read_text().splitlines():
        if line.startswith("# expect: "):
            expect = line.removeprefix("# expect: ").replace("{dir}", str(INVENTORIES.resolve()))
        elif line.startswith("# hint: "):
            hint = line.removeprefix("# hint: ")
    assert expect, f"{path} has no '# expect:' line"
    return expect, hint


def table_rows(out: str) -> list[list[str]]:
    """The table's body cells, with rows that rich wrapped onto several lines joined again."""
    rows: list[list[str]] = []
    for line in out.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[0]:
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    return rows


def test_plan_table() -> None:
    code, out, err = run_cli("plan", str(GOOD))
    assert (code, err) == (0, "")
    assert out.splitlines()[0].strip() == "job demo: 5 tasks on 2 hosts"
    assert table_rows(out) == [
        ["chief:0", "gpu1", "10.0.0.1:2222", "0", "python3 train.py --role chief --index 0"],
        ["worker:0", "gpu1", "10.0.0.1:2223", "1", "tfdeploy:server"],
        [
            "evaluator:0",
            "gpu1",
            "10.0.0.1 (no TF port)",
            "-",
            "python3 train.py --role evaluator --index 0",
        ],
        ["worker:1", "cpu1", "10.0.0.2:3000", "-", "tfdeploy:server"],
        ["ps:0", "cpu1", "10.0.0.2:3001", "-", "tfdeploy:server"],
    ]
    cluster = (
        '{"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.1:2223", "10.0.0.2:3000"], '
        '"ps": ["10.0.0.2:3001"]}'
    )
    configs = one_line(out.split("TF_CONFIG per task", 1)[1])
    # The evaluator's cluster dict lists it alone (port 0: it has no TF port); no other one does.
    own = '{"evaluator": ["10.0.0.1:0"]}'
    expected = [
        f'{name} TF_CONFIG={{"cluster": {own if role == "evaluator" else cluster}, "task": '
        f'{{"type": "{role}", "index": {index}}}}}'
        for name, role, index in [
            ("chief:0", "chief", 0),
            ("worker:0", "worker", 0),
            ("evaluator:0", "evaluator", 0),
            ("worker:1", "worker", 1),
            ("ps:0", "ps", 0),
        ]
    ]
    assert configs == one_line(" ".join(expected))
    assert "tok-SECRET-value" not in out


def _masks(out: str) -> list[str]:
    """The lines of the plan's "CUDA_VISIBLE_DEVICES per task" section, spaces collapsed."""
    section = out.split("CUDA_VISIBLE_DEVICES per task\n", 1)[1].split("\n\n", 1)[0]
    return [" ".join(line.split()) for line in section.splitlines()]


def test_plan_prints_each_tasks_cuda_visible_devices_as_up_exports_it(tmp_path: Path) -> None:
    """Every task's mask, the empty one (no GPUs: TF sees none) quoted so it can be seen, and a
    `gpus = "auto"` share said to be split at preflight rather than guessed."""
    code, out, err = run_cli("plan", str(GOOD))
    assert (code, err) == (0, "")
    assert _masks(out) == [
        "chief:0 CUDA_VISIBLE_DEVICES=0",
        "worker:0 CUDA_VISIBLE_DEVICES=1",
        'evaluator:0 CUDA_VISIBLE_DEVICES=""',
        'worker:1 CUDA_VISIBLE_DEVICES=""',
        'ps:0 CUDA_VISIBLE_DEVICES=""',
    ]
    inventory = tmp_path / "auto.toml"
    inventory.write_text(
        '[job]\nname = "a"\ncode = "."\ncommand = "python3 t.py"\nstrategy = "tf1"\n\n'
        '[[hosts]]\naddress = "10.0.0.1"\ngpus = 4\ntasks = [{ role = "worker", count = 2 }]\n\n'
        '[[hosts]]\naddress = "10.0.0.2"\ngpus = "auto"\n'
        'tasks = [{ role = "worker" }, { role = "ps" }]\n'
    )
    code, out, err = run_cli("plan", str(inventory))
    assert (code, err) == (0, "")
    assert _masks(out) == [
        "worker:0 CUDA_VISIBLE_DEVICES=0,1",
        "worker:1 CUDA_VISIBLE_DEVICES=2,3",
        'worker:2 CUDA_VISIBLE_DEVICES: split at preflight (gpus = "auto")',
        'ps:0 CUDA_VISIBLE_DEVICES=""',
    ]


def test_plan_json_document() -> None:
    code, out, err = run_cli("plan", "--json", str(GOOD))
    assert (code, err) == (0, "")
    doc = json.loads(out)
    cluster = {
        "chief": ["10.0.0.1:2222"],
        "worker": ["10.0.0.1:2223", "10.0.0.2:3000"],
        "ps": ["10.0.0.2:3001"],
    }
    own = {"evaluator": ["10.0.0.1:0"]}  # the evaluator's cluster dict lists it alone

    def task(role: str, index: int, host: str, port: int | None, gpus: list[int], cmd: str) -> dict:
        address = {"gpu1": "10.0.0.1", "cpu1": "10.0.0.2"}[host]
        return {
            "role": role,
            "index": index,
            "host": host,
            "address": address,
            "port": port,
            "gpus": gpus,
            "command": cmd,
            "env": {
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "API_TOKEN": "********",
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": own if role == "evaluator" else cluster,
                        "task": {"type": role, "index": index},
                    }
                ),
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
                "TFDEPLOY_TASK": f"{role}:{index}",
            },
        }

    train = "python3 train.py --role {} --index {}"
    assert doc == {
        "job": {
            "name": "demo",
            "code": str(INVENTORIES.resolve()),
            "command": "python3 train.py --role {task_type} --index {task_index}",
            "python": "python3",
            "workdir": "~/.tfdeploy",
            "port": 2222,
            "setup": [],
            "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "API_TOKEN": "********"},
            "cluster": cluster,
        },
        "tasks": [
            task("chief", 0, "gpu1", 2222, [0], train.format("chief", 0)),
            task("worker", 0, "gpu1", 2223, [1], "tfdeploy:server"),
            task("evaluator", 0, "gpu1", None, [], train.format("evaluator", 0)),
            task("worker", 1, "cpu1", 3000, [], "tfdeploy:server"),
            task("ps", 0, "cpu1", 3001, [], "tfdeploy:server"),
        ],
        "environments": [],  # no `requirements`: no environment of the job's own
    }
    assert "tok-SECRET-value" not in out


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
@pytest.mark.parametrize("json_flag", [False, True], ids=["table", "json"])
def test_each_mistake_is_one_message_and_exit_2(path: Path, json_flag: bool) -> None:
    expect, hint = expectation(path)
    argv = ["plan", *(["--json"] if json_flag else []), str(path)]
    code, out, err = run_cli(*argv)
    assert code == 2
    assert out == ""
    wanted = f"error: {path}: {expect}" + (f" hint: {hint}" if hint else "")
    assert one_line(err) == one_line(wanted)
    assert "Traceback" not in err


def test_missing_file_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli("plan", "/nonexistent/inv.toml")
    assert (code, out, err.strip()) == (2, "", "error: /nonexistent/inv.toml: file not found")
    assert run_cli("nosuchverb")[0] == 2
    assert run_cli("plan")[0] == 2
    assert "usage: tfdeploy" in capsys.readouterr().err
    assert run_cli("--help")[0] == 0


def test_traceback_flag_shows_the_traceback_but_keeps_the_exit_status() -> None:
    """--traceback is for debugging: a script's exit 2 must not become 1 because of it."""
    code, out, err = run_cli("--traceback", "plan", str(INVENTORIES / "bad_duplicate_host.toml"))
    assert (code, out) == (2, "")
    assert "Traceback (most recent call last)" in err
    assert "deployer.core.errors.InventoryError: " in err
    assert "error: " in err and "hosts[1].name: duplicate host name" in one_line(err)


def test_internal_bug_is_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_inventory: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(deployer.api.deploy, "make_plan", broken)
    code, out, err = run_cli("plan", str(GOOD))
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "internal error: RuntimeError: boom",
        "hint: run again with --traceback and report it",
    ]
    with pytest.raises(RuntimeError, match="boom"):
        run_cli("--traceback", "plan", str(GOOD))


def test_real_process_exit_codes_and_no_traceback(tmp_path: Path) -> None:
    bad = INVENTORIES / "bad_gpu_index.toml"
    result = subprocess.run(
        [*TFDEPLOY, "plan", str(bad)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert one_line(result.stderr) == one_line(f"error: {bad}: {expectation(bad)[0]}")

    good = subprocess.run(
        [*TFDEPLOY, "plan", "--json", str(GOOD)], capture_output=True, text=True, timeout=60
    )
    assert (good.returncode, good.stderr) == (0, "")
    assert [t["env"]["TFDEPLOY_TASK"] for t in json.loads(good.stdout)["tasks"]] == [
        "chief:0",
        "worker:0",
        "evaluator:0",
        "worker:1",
        "ps:0",
    ]

    debug = subprocess.run(
        [*TFDEPLOY, "--traceback", "plan", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert "Traceback (most recent call last)" in debug.stderr
    assert "deployer.core.errors.InventoryError: " in debug.stderr
    assert debug.returncode == 2  # the error's own status, traceback or not
