"""The end of `up` says the run id and what to type next; `logs` and `pull` given the inventory
take its job's newest run and say so. Through the real CLI and agent on this machine
(`transport = "local"`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import one_line, run_cli
from tests.support.local_jobs import local_job, run_id_of, state  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)


def test_up_ends_with_the_run_id_and_the_commands_to_look_at_it(
    tmp_path: Path,
    state: Path,  # noqa: F811
) -> None:
    job = f'artifacts = ["*.txt"]\nartifacts_to = "{tmp_path / "artifacts"}"'
    inventory = local_job(tmp_path, "echo run $TFDEPLOY_RUN_ID > out.txt", job)
    code, out, err = run_cli("up", str(inventory))
    assert code == 0, out + err
    run_id = run_id_of(out)
    assert [one_line(line) for line in out.splitlines()[-3:]] == [
        f"tfdeploy: next, for run {run_id}:",
        f"tfdeploy: logs: tfdeploy logs {run_id}",
        f"tfdeploy: files: tfdeploy pull {run_id} '*.txt' (into ./tfdeploy-runs/{run_id}/)",
    ]
    code, out, err = run_cli("up", "--detach", str(inventory))
    assert code == 0, out + err
    detached = run_id_of(out)
    assert detached != run_id
    tail = [one_line(line) for line in out.splitlines()[-4:]]
    assert tail[0] == f"tfdeploy: next, for run {detached}:"
    assert (
        tail[3] == f"tfdeploy: stop: tfdeploy down {detached} (stops it, then pulls its artifacts)"
    )
    assert run_cli("down", detached)[0] == 0

    # The inventory alone: its job's newest run (the detached one), said on stderr.
    code, out, err = run_cli("logs", str(inventory))
    assert code == 0, out + err
    assert f"run {detached}, the newest of job 'pulls'" in one_line(err)
    code, out, err = run_cli("pull", str(inventory), "out.txt", "--to", str(tmp_path / "home"))
    assert code == 0, out + err
    assert f"pull: run {detached}, the newest of job 'pulls'" in one_line(err)
    pulled = tmp_path / "home" / detached / "worker-0" / "out.txt"
    assert pulled.read_text() == f"run {detached}\n"


def test_logs_of_an_inventory_without_runs_says_so(tmp_path: Path, state: Path) -> None:  # noqa: F811
    code, out, err = run_cli("logs", str(local_job(tmp_path, "true")))
    assert (code, out) == (2, "")
    assert "logs: no runs of job 'pulls' on local" in one_line(err)
