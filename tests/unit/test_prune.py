"""The prune op on real local workdirs, through the real agent (remote/prune.py).

Runs are made by `materialize` (their code hard-linked from the store, as on a host), running
tasks by `start`, environments by venvs.py's own marker and use records. Every prune here but
the one about the grace passes `grace: 0`, so the rules are seen without waiting an hour.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.agent import AGENT, call, ok, put_in_store
from tests.support.agent_runs import A, make_run, prune

pytestmark = pytest.mark.timeout(60)

B = "host-b"
REMOTE = AGENT.parent


def make_env(workdir: Path, env_hash: str, *runs: str) -> Path:
    """A built environment (its `.complete` marker) that `runs` used, recorded by venvs.py."""
    venv = workdir / "envs" / env_hash
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_bytes(b"x" * 1000)
    (venv / ".complete").write_text("{}")
    script = (
        f"import sys, pathlib; sys.path.insert(0, {str(REMOTE)!r}); import venvs\n"
        f"for run in {list(runs)!r}: venvs.record_use(pathlib.Path({str(venv)!r}), run)"
    )
    subprocess.run([sys.executable, "-I", "-c", script], check=True)
    return venv


def runs_of(workdir: Path, host: str = A) -> list[str]:
    return sorted(p.name for p in (workdir / "hosts" / host / "runs").iterdir())


def test_the_newest_runs_of_each_job_stay_and_the_others_go(workdir: Path) -> None:
    shared = put_in_store(workdir, b"shared by every run")
    made = [make_run(workdir, f"a{i}", "alpha", [shared]) for i in range(4)]
    made += [make_run(workdir, f"b{i}", "beta", [shared]) for i in range(2)]
    (made[0] / "code" / "out.bin").write_bytes(b"o" * 5000)  # what a task left

    reply = prune(workdir, keep=2)

    assert sorted(reply["runs"]) == ["a0", "a1"]  # beta's two are its newest two
    assert runs_of(workdir) == ["a2", "a3", "b0", "b1"]
    assert reply["contents"] == 0 and (workdir / "store" / shared).is_file()
    assert reply["bytes"] >= 5000  # the task's file; the shared content was not freed
    assert reply["running"] == [] and reply["dry_run"] is False
    assert prune(workdir, keep=2)["runs"] == []  # nothing left to do


def test_a_content_goes_with_the_last_run_that_links_it(workdir: Path) -> None:
    shared = put_in_store(workdir, b"in the kept run and the pruned one")
    only_old = put_in_store(workdir, b"o" * 3000)
    make_run(workdir, "old", "demo", [shared, only_old])
    time.sleep(0.01)
    make_run(workdir, "new", "demo", [shared])

    reply = prune(workdir, keep=1)

    assert reply["runs"] == ["old"] and reply["contents"] == 1
    assert (workdir / "store" / shared).is_file()
    assert not (workdir / "store" / only_old).exists()
    assert reply["bytes"] >= 3000
    assert (workdir / "hosts" / A / "runs" / "new" / "code" / "f0.txt").is_file()


def test_an_environment_goes_when_only_pruned_runs_used_it(workdir: Path) -> None:
    for run in ("r0", "r1", "r2"):
        make_run(workdir, run, "demo", [])
        time.sleep(0.01)
    kept = make_env(workdir, "env-kept", "r0", "r2")  # r2 stays: so does its env
    gone = make_env(workdir, "env-gone", "r0", "r1")

    reply = prune(workdir, keep=1)

    assert sorted(reply["runs"]) == ["r0", "r1"]
    assert reply["environments"] == ["env-gone"]
    assert not gone.exists() and (kept / ".complete").is_file()
    assert reply["bytes"] >= 1000
    assert sorted(os.listdir(workdir / "envs")) == ["env-kept"]  # no grave, no lock left


def test_the_hosts_wheel_directory_and_uv_cache_go_with_the_environments(workdir: Path) -> None:
    """What a build left beside the env (remote/venvs.py wheels_dir, uv_cache): the wheel's
    link and the cache's unpacked files go with the pruned env, and with the link gone the
    wheel's content leaves the store too."""
    for run in ("r0", "r1"):
        make_run(workdir, run, "demo", [])
        time.sleep(0.01)
    make_env(workdir, "env-gone", "r0")
    wheel = put_in_store(workdir, b"w" * 4000)
    here = workdir / "hosts" / A
    (here / "wheels").mkdir()
    os.link(workdir / "store" / wheel, here / "wheels" / "tiny-1.0-py3-none-any.whl")
    (here / "uv-cache" / "archive-v0" / "x").mkdir(parents=True)
    (here / "uv-cache" / "archive-v0" / "x" / "tiny.py").write_bytes(b"u" * 3000)

    reply = prune(workdir, keep=1)

    assert reply["environments"] == ["env-gone"]
    assert not (here / "wheels").exists() and not (here / "uv-cache").exists()
    assert reply["contents"] == 1 and not (workdir / "store" / wheel).exists()
    assert reply["bytes"] >= 1000 + 4000 + 3000
    assert not [p for p in here.iterdir() if p.name.startswith(".pruned-")]  # no grave left


def test_a_running_run_is_never_touched_nor_what_it_uses(workdir: Path, run_id: str) -> None:
    mine = put_in_store(workdir, b"only the running run's")
    running = make_run(workdir, run_id, "demo", [mine])
    ok(
        call(
            workdir,
            "start",
            host=A,
            run_id=run_id,
            tasks=[{"name": "worker:0", "command": "sleep 30", "env": {}}],
            grace=1,
        )
    )
    env = make_env(workdir, "env-running", run_id)
    for i in range(2):
        time.sleep(0.01)
        make_run(workdir, f"{run_id}-later{i}", "demo", [])

    reply = prune(workdir, keep=0)

    assert reply["running"] == [run_id]
    assert sorted(reply["runs"]) == [f"{run_id}-later0", f"{run_id}-later1"]
    assert reply["contents"] == 0 and reply["environments"] == []
    assert (running / "code" / "f0.txt").read_bytes() == b"only the running run's"
    assert (workdir / "store" / mine).is_file() and (env / ".complete").is_file()
    assert runs_of(workdir) == [run_id]


def test_a_run_whose_lease_is_live_stays(workdir: Path) -> None:
    """A controller deploying it: materialized, no task started yet, heartbeats the lease."""
    make_run(workdir, "deploying", "demo", [], detached=False, lease_seconds=60)
    make_run(workdir, "lapsed", "demo", [], detached=False, lease_seconds=60)
    lapsed = workdir / "hosts" / A / "runs" / "lapsed" / "lease"
    os.utime(lapsed, (time.time() - 120, time.time() - 120))

    reply = prune(workdir, keep=0)

    assert reply["running"] == ["deploying"] and reply["runs"] == ["lapsed"]


def test_older_than_spares_the_runs_created_after_the_date(workdir: Path) -> None:
    for i in range(3):
        make_run(workdir, f"r{i}", "demo", [])
        time.sleep(0.02)
    cut = _created(workdir, "r1")

    reply = prune(workdir, keep=0, older_than=cut)

    assert reply["runs"] == ["r0"] and runs_of(workdir) == ["r1", "r2"]


def test_a_dry_run_removes_nothing_and_says_what_a_prune_removes(workdir: Path) -> None:
    only_old = put_in_store(workdir, b"only in the old run")
    make_run(workdir, "old", "demo", [only_old])
    time.sleep(0.01)
    make_run(workdir, "new", "demo", [])
    make_env(workdir, "env-old", "old")
    before = _tree(workdir)

    said = prune(workdir, keep=1, dry_run=True)

    assert _tree(workdir) == before
    assert said["dry_run"] is True
    done = prune(workdir, keep=1)
    assert {k: said[k] for k in ("runs", "contents", "environments", "bytes")} == {
        k: done[k] for k in ("runs", "contents", "environments", "bytes")
    }
    assert (said["runs"], said["contents"], said["environments"]) == (["old"], 1, ["env-old"])


def test_a_content_stored_within_the_grace_stays(workdir: Path) -> None:
    """Stored by a push whose materialize has not linked it yet: no run names it so far."""
    fresh = put_in_store(workdir, b"on its way into a run")

    assert ok(call(workdir, "prune", host=A, keep=0))["contents"] == 0
    assert (workdir / "store" / fresh).is_file()
    assert prune(workdir, keep=0)["contents"] == 1  # past the grace it goes


def test_a_run_on_another_host_of_a_shared_workdir_is_safe(workdir: Path, run_id: str) -> None:
    shared = put_in_store(workdir, b"both hosts' code")
    make_run(workdir, f"{run_id}-a", "demo", [shared], host=A)
    theirs = make_run(workdir, run_id, "demo", [shared], host=B)
    ok(
        call(
            workdir,
            "start",
            host=B,
            run_id=run_id,
            tasks=[{"name": "worker:0", "command": "sleep 30", "env": {}}],
            grace=1,
        )
    )
    env = make_env(workdir, "env-b", run_id)
    # Host A's own run of the same id goes; B's, its content and its environment stay.
    make_run(workdir, run_id, "demo", [shared], host=A)

    reply = prune(workdir, keep=0, host=A)

    assert sorted(reply["runs"]) == sorted([f"{run_id}-a", run_id])
    assert reply["contents"] == 0 and reply["environments"] == []
    assert (theirs / "code" / "f0.txt").is_file() and (theirs / "tasks").is_dir()
    assert (workdir / "store" / shared).is_file() and (env / ".complete").is_file()
    assert runs_of(workdir, B) == [run_id]


def test_a_bad_keep_is_refused(workdir: Path) -> None:
    reply = call(workdir, "prune", host=A, keep=-1)
    assert reply["ok"] is False and "keep must be 0 or more" in reply["error"]


def _created(workdir: Path, run: str) -> float:
    import json

    meta = json.loads((workdir / "hosts" / A / "runs" / run / "run.json").read_text())
    return float(meta["created"])


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime_ns) for p in root.rglob("*"))


def test_older_than_and_grace_read_dates_and_ages() -> None:
    from deployer.api.prune import parse_age, parse_grace
    from deployer.core.errors import UsageError

    assert abs(parse_age("7d") - (time.time() - 7 * 86400)) < 5
    assert parse_age("2025-03-01T00:00:00+00:00") == 1740787200.0
    assert (parse_grace("0"), parse_grace("90s"), parse_grace("30m")) == (0.0, 90.0, 1800.0)
    for bad in ("yesterday", "7x", ""):
        with pytest.raises(UsageError, match="older-than"):
            parse_age(bad)
    with pytest.raises(UsageError, match="not a duration"):
        parse_grace("soon")
