"""The CLI misused as a newcomer would (issue #18): pipes, narrow terminals, odd flags, down.

Runs that need a host use the local transport (this machine, through the real agent).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from deployer.api.render import status_table
from deployer.cli.parser import DISTRIBUTION
from deployer.hosts.reply_types import TaskStatus
from deployer.results.runs import HostRun
from deployer.sources.aws.settings import INSTALL_HINT
from tests.support.helpers import free_port, run_cli

ROOT = Path(__file__).resolve().parents[2]

INVENTORIES = Path(__file__).parent.parent / "inventories"
GOOD = INVENTORIES / "good_pss.toml"
LINES = 20_000  # more than a pipe buffer holds, so a closed reader is noticed
LONG = "L" * 2000  # longer than the 512 bytes per line the old --tail guessed


def local_inventory(tmp: Path, command: str, *, env: str = "", hosts: str = "") -> Path:
    """A job of one worker on this machine (transport = "local"), plus any extra hosts."""
    (tmp / "code").mkdir(exist_ok=True)
    path = tmp / "inv.toml"
    path.write_text(
        f'[job]\nname = "hard"\ncode = "code"\ncommand = {json.dumps(command)}\n'
        f'workdir = "{tmp}/wd"\npython = "{sys.executable}"\nport = {free_port()}\n'
        "require_tensorflow = false\n"
        f"stop_grace = 2\n{env}\n"
        '[[hosts]]\nname = "local"\naddress = "127.0.0.1"\ntransport = "local"\n'
        'tasks = [{ role = "worker" }]\n' + hosts
    )
    return path


def tfdeploy(*argv: str, state: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(state)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "deployer", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        **kwargs,
    )


@dataclass(frozen=True)
class FinishedRun:
    inventory: Path
    run_id: str
    state: Path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """A run whose worker printed LINES numbered lines, a long line and `last`, then exited."""
    tmp = tmp_path_factory.mktemp("logs")
    (tmp / "code").mkdir()
    (tmp / "code" / "gen.py").write_text(
        f"for i in range({LINES}):\n    print(i)\nprint({LONG!r})\nprint('last')\n"
    )
    inventory = local_inventory(tmp, f"{sys.executable} gen.py")
    up = tfdeploy("up", str(inventory), state=tmp / "state")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr
    run_id = next(w for w in up.stdout.split() if w.startswith("hard-")).rstrip(")")
    return FinishedRun(inventory, run_id, tmp / "state")


# -- logs --------------------------------------------------------------------------------------


def logs(run: FinishedRun, *args: str) -> list[str]:
    code, out, err = run_cli("logs", run.run_id, "-i", str(run.inventory), *args)
    assert (code, err) == (0, "")
    return [line.removeprefix("worker:0@local | ") for line in out.splitlines()]


def test_tail_starts_at_a_line_boundary_and_0_means_nothing(finished_run: FinishedRun) -> None:
    assert logs(finished_run, "--tail", "0") == []
    assert logs(finished_run, "--tail", "1") == ["last"]
    assert logs(finished_run, "--tail", "3") == [str(LINES - 1), LONG, "last"]
    every = logs(finished_run)
    assert every == [*map(str, range(LINES)), LONG, "last"]
    assert logs(finished_run, "--tail", str(LINES + 50)) == every


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--tail", "-2"], "--tail: must be 0 or more, got -2"),
        (["--tail", "x"], "--tail: expected a whole number, got 'x'"),
        (["--task", ""], "--task: expected ROLE:INDEX such as worker:1, got ''"),
        (["--task", "worker"], "--task: expected ROLE:INDEX such as worker:1, got 'worker'"),
    ],
)
def test_bad_logs_flags_are_usage_errors(
    finished_run: FinishedRun, capsys: pytest.CaptureFixture[str], args: list[str], complaint: str
) -> None:
    code, out, _ = run_cli("logs", finished_run.run_id, "-i", str(finished_run.inventory), *args)
    assert (code, out) == (2, "")
    assert complaint in capsys.readouterr().err


def test_logs_help_says_an_inventory_means_its_newest_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli("logs", "--help")[0] == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert "a run id, or an inventory file: its job's newest run on the hosts" in usage


def test_logs_into_a_closed_pipe_exits_141_quietly(finished_run: FinishedRun) -> None:
    argv = ["logs", finished_run.run_id, "-i", str(finished_run.inventory)]
    assert head_1(argv, finished_run.state) == (141, "worker:0@local | 0\n", "")


def head_1(argv: list[str], state: Path) -> tuple[int, str, str]:
    """`tfdeploy ARGV | head -1`: exit status, the line read, and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(state)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    code = proc.wait(timeout=120)
    return code, first, proc.stderr.read()


# -- status ------------------------------------------------------------------------------------


def test_status_of_an_unknown_run_is_a_usage_error(finished_run: FinishedRun) -> None:
    inventory = str(finished_run.inventory)
    code, out, err = run_cli("status", "hard-20990101T000000Z-abcd", "-i", inventory)
    assert (code, out) == (2, "")
    assert "error: no run hard-20990101T000000Z-abcd on " in err
    code, out, err = run_cli("status", finished_run.run_id, "-i", inventory)
    assert (code, err) == (0, "")
    assert f"run {finished_run.run_id}" in out and "exited 0" in out


def host_runs() -> list[HostRun]:
    t0 = 1_700_000_000.0
    long_host = "ip-10-0-12-34.eu-west-1.compute.internal"
    return [
        HostRun(
            long_host,
            "mnist-training-20261123T102032Z-ddef",
            "mnist-training",
            t0,
            True,
            (
                TaskStatus("worker:0", "exited", 1480260, exit_code=0, started=t0, restarts=2),
                TaskStatus("evaluator:0", "lost", 148261, started=t0),
            ),
        ),
        HostRun(
            "h2",
            "mnist-training-20261123T102032Z-ddef",
            "mnist-training",
            t0,
            True,
            (
                TaskStatus("chief:0", "running", 4194304, started=t0),
                TaskStatus("ps:0", "exited", 4243, exit_code=137, started=t0),
            ),
        ),
    ]


@pytest.mark.parametrize("width", [80, 100])
def test_status_table_fits_the_width_and_never_splits_a_number(width: int) -> None:
    console = Console(width=width, color_system=None, file=__import__("io").StringIO())
    console.print(status_table(host_runs()))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), out
    table = [line for line in lines if line.startswith("│")]
    cells = {cell.strip() for line in table for cell in line.strip("│").split("│")}
    for pid in ("1480260", "148261", "4194304", "4243"):
        assert pid in cells, out  # whole, in one cell of one line
    assert "exited 137 (signal" in " ".join(out.split())  # words may wrap, numbers not
    assert lines[0].startswith("run mnist-training-20261123T102032Z-ddef"), out


# -- pipes -------------------------------------------------------------------------------------


@pytest.mark.names_tf(reason="plans good_pss.toml or refuses its flags; starts nothing")
def test_output_to_a_pipe_is_never_wrapped(tmp_path: Path) -> None:
    plan = tfdeploy("plan", str(GOOD), state=tmp_path)
    assert plan.returncode == 0, plan.stderr
    configs = [line for line in plan.stdout.splitlines() if "TF_CONFIG=" in line]
    assert len(configs) == 5
    for line in configs:  # each one whole: a JSON document on one line
        config = json.loads(line.split("TF_CONFIG=", 1)[1])
        evaluator = config["task"]["type"] == "evaluator"  # its own cluster: itself alone
        wanted = {"evaluator": ["10.0.0.1:0"]} if evaluator else {"ps": ["10.0.0.2:3001"]}
        assert wanted.items() <= config["cluster"].items()
    unknown = tfdeploy("logs", "no-such-run-but-a-long-enough-name-to-wrap", state=tmp_path)
    assert unknown.returncode == 2
    assert len(unknown.stderr.splitlines()) == 2, unknown.stderr  # the error and its hint


def big_inventory(tmp: Path, hosts: int) -> Path:
    (tmp / "code").mkdir(exist_ok=True)
    lines = ['[job]\nname = "big"\ncode = "code"\ncommand = "python3 train.py"\n']
    for i in range(hosts):
        role = "chief" if i == 0 else "worker"
        address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        lines.append(
            f'[[hosts]]\nname = "h{i}"\naddress = "{address}"\ntasks = [{{ role = "{role}" }}]\n'
        )
    path = tmp / f"big{hosts}.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.mark.names_tf(reason="plans good_pss.toml or refuses its flags; starts nothing")
@pytest.mark.parametrize("json_flag", [True, False], ids=["json", "table"])
def test_plan_into_a_closed_pipe_exits_141_quietly(tmp_path: Path, json_flag: bool) -> None:
    """The reader is gone before tfdeploy writes (`| head -0`): its first write fails."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "plan", *(["--json"] if json_flag else []), str(GOOD)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert (proc.wait(timeout=60), proc.stderr.read()) == (141, "")


# -- plan --------------------------------------------------------------------------------------


def test_a_big_plan_shows_the_cluster_once_and_json_keeps_every_tf_config(
    tmp_path: Path,
) -> None:
    inventory = str(big_inventory(tmp_path, 300))
    code, out, err = run_cli("plan", inventory)
    assert (code, err) == (0, "")
    assert out.splitlines()[0].strip() == "job big: 300 tasks on 300 hosts"
    assert out.count("10.0.1.43:2222") == 2  # its row in the table, once in the cluster
    assert len(out) < 100_000  # one TF_CONFIG per task was 1.8 MB
    assert "tasks with another TF_CONFIG" not in out
    code, doc, err = run_cli("plan", "--json", inventory)
    tasks = json.loads(doc)["tasks"]
    configs = [json.loads(t["env"]["TF_CONFIG"]) for t in tasks]
    assert len(configs) == 300 and configs[299]["task"] == {"type": "worker", "index": 298}
    assert all(len(c["cluster"]["worker"]) == 299 for c in configs)


def test_counts_are_singular_for_one(tmp_path: Path) -> None:
    code, out, _ = run_cli("plan", str(local_inventory(tmp_path, "true")))
    assert code == 0
    assert out.splitlines()[0].strip() == "job hard: 1 task on 1 host"


# -- small flags -------------------------------------------------------------------------------


def test_version_is_our_distributions_and_every_install_hint_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The distribution is tfdeploy-cluster: `tfdeploy` on PyPI is another project, whose version
    (or install) a hint naming it would give."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name == DISTRIBUTION == "tfdeploy-cluster"
    assert f"pip install '{name}[aws]'" in INSTALL_HINT
    try:
        expected = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # a venv that has the checkout on its path only
        expected = "unknown (not installed)"
    assert run_cli("--version")[0] == 0
    assert capsys.readouterr().out == f"tfdeploy {expected}\n"


@pytest.mark.names_tf(reason="plans good_pss.toml or refuses its flags; starts nothing")
@pytest.mark.parametrize("verb", ["up", "exec"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_concurrency_below_1_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], verb: str, value: str
) -> None:
    code, out, _ = run_cli(verb, "--concurrency", value, str(GOOD))
    assert (code, out) == (2, "")
    assert f"--concurrency: must be 1 or more, got {value}" in capsys.readouterr().err


# -- down, exec and hosts that fail -------------------------------------------------------------

SECRET = "tok-s3cret-4711"


@pytest.fixture
def detached_with_a_sidecar(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A detached run whose task started a sidecar with setsid (its own process group)."""
    marker = f"tfdeploy-down-escape-{os.getpid()}"
    sidecar = f"setsid {sys.executable} -c 'import time; time.sleep(600)' $API_TOKEN {marker}"
    inventory = local_inventory(
        tmp_path, f"{sidecar} & exec sleep 600", env=f'env = {{ API_TOKEN = "{SECRET}" }}\n'
    )
    up = tfdeploy("up", "--detach", str(inventory), state=tmp_path / "state")
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = next(w for w in up.stdout.split() if w.startswith("hard-")).rstrip(")")
    try:
        yield inventory, run_id, marker
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)


def test_down_reports_the_escaped_processes_it_stopped_with_secrets_masked(
    detached_with_a_sidecar: tuple[Path, str, str],
) -> None:
    inventory, run_id, marker = detached_with_a_sidecar
    deadline = time.monotonic() + 10
    while not pgrep(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = pgrep(marker)
    assert pid, "the sidecar never started"
    code, out, err = run_cli("down", run_id, "-i", str(inventory))
    assert (code, err) == (0, "")
    assert f"stopped run {run_id} on local" in out
    flat = " ".join(out.split())
    assert (
        "local: also stopped 1 process of the run that had left its task's process group: "
        f"pid {pid} ("
    ) in flat
    assert marker in flat and "********" in flat and SECRET not in flat
    assert flat.endswith("): SIGTERM") or flat.endswith("): SIGKILL"), flat
    assert not pgrep(marker)


FORWARDED = "hf_abcdefgh12345"  # an HF_TOKEN this shell forwards to the task


def test_forwarded_and_secret_env_values_are_masked_in_everything_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28 item 7: a task printing its forward_env token (or a secret_env value) and
    failing showed it in clear in the failure summary; the log lines and `logs` too."""
    monkeypatch.setenv("HF_TOKEN", FORWARDED)
    inventory = local_inventory(
        tmp_path,
        'echo "token=$HF_TOKEN run=$RUN_NAME"; sleep 1; exit 3',
        env='forward_env = ["HF_TOKEN"]\nsecret_env = ["RUN_NAME"]\n'
        'env = { RUN_NAME = "private-run-name" }\n',
    )
    state = tmp_path / "state"
    up = tfdeploy("up", str(inventory), state=state)
    assert up.returncode == 1, up.stdout + up.stderr
    run_id = next(w for w in up.stdout.split() if w.startswith("hard-")).rstrip(")")
    said = "token=******** run=********"
    assert f"worker:0@local | {said}" in up.stdout  # the streamed line (plain view)
    assert said in up.stderr  # the failure summary's last lines
    shown = [up.stdout, up.stderr]
    # The archive keeps the task's line with each secret blanked to its length (issue 62: no
    # secret in this machine's records), so `logs` read from it shows those `*`.
    blanked = f"token={'*' * len(FORWARDED)} run={'*' * len('private-run-name')}"
    for extra in ((), ("--sync",)):  # `logs` from the archive, and after reading the host
        logs = tfdeploy("logs", run_id, *extra, state=state)
        assert logs.returncode == 0 and blanked in logs.stdout, logs
        shown.append(logs.stdout)
    for text in shown:
        assert FORWARDED not in text and "private-run-name" not in text
    archive = state / "runs" / run_id / "worker-0.log"
    assert archive.read_bytes() == f"{blanked}\n".encode()
    assert archive.stat().st_mode & 0o077 == 0 and archive.parent.stat().st_mode & 0o077 == 0


def pgrep(pattern: str) -> str:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.strip()


def unreachable_host() -> str:
    return (
        '[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\n'
        f'ssh = {{ port = {free_port()}, user = "root" }}\ntasks = [{{ role = "worker" }}]\n'
    )


def test_exec_and_down_word_a_failing_host_for_their_verb(tmp_path: Path) -> None:
    inventory = str(local_inventory(tmp_path, "true", hosts=unreachable_host()))
    code, out, err = run_cli("exec", inventory, "--", "echo", "hi")
    assert code == 3
    assert out == "local | hi\n"  # the reachable host's output is not lost
    assert "exec failed on 1 host; the command ran on the other hosts:" in err
    assert "gone: " in err and "nothing was started" not in err
    code, out, err = run_cli("down", inventory)
    assert code == 3
    assert "stopping failed on 1 host; nothing was stopped:" in err
    assert "nothing was started" not in err


def test_status_json_keeps_the_answering_hosts_and_marks_the_unreachable_one(
    tmp_path: Path,
) -> None:
    """Issue 28 item 6: one unreachable host made `status --json` print no JSON at all."""
    inventory = local_inventory(tmp_path, "sleep 600")
    state = tmp_path / "state"
    up = tfdeploy("up", "--detach", str(inventory), state=state)
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = next(w for w in up.stdout.split() if w.startswith("hard-")).rstrip(")")
    try:
        inventory.write_text(inventory.read_text() + unreachable_host())
        status = tfdeploy("status", str(inventory), "--json", state=state)
        assert status.returncode == 3, status.stdout + status.stderr
        document = json.loads(status.stdout)
        assert [(r["run_id"], r["host"]) for r in document["runs"]] == [(run_id, "local")]
        assert [t["state"] for t in document["runs"][0]["tasks"]] == ["running"]
        [gone] = document["unreachable"]
        assert gone["host"] == "gone" and "refused" in gone["error"], gone
        error = " ".join(status.stderr.split())
        assert "listing runs failed on 1 host; the other hosts' answers are shown: gone: " in error
        table = tfdeploy("status", str(inventory), state=state)
        assert table.returncode == 3 and f"run {run_id}" in table.stdout, table
    finally:
        tfdeploy("down", run_id, "-i", str(inventory), state=state)


def test_an_error_into_a_closed_stderr_pipe_exits_141(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployer", "plan", str(INVENTORIES / "bad_gpu_index.toml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path)},
    )
    assert proc.stderr is not None
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141


def test_status_logs_and_down_create_nothing_on_a_host_without_the_workdir(
    tmp_path: Path,
) -> None:
    """A verb that only looks must not leave a workdir (and an agent) on a host it asked."""
    inventory = local_inventory(tmp_path, "true")
    state = tmp_path / "state"
    status = tfdeploy("status", str(inventory), state=state)
    assert status.returncode == 0 and "no runs" in status.stdout + status.stderr, status
    down = tfdeploy("down", str(inventory), state=state)
    assert down.returncode == 0, down.stdout + down.stderr
    logs = tfdeploy("logs", "hard-20261123T000000Z-abcd", "-i", str(inventory), state=state)
    assert logs.returncode == 2, logs.stdout + logs.stderr
    assert not (tmp_path / "wd").exists()


def test_tunnel_help_names_the_default_task_the_code_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deployer.config.roles import LEAD_TASKS

    assert run_cli("tunnel", "--help")[0] == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert f"(default: {', else '.join(LEAD_TASKS)})" in usage
