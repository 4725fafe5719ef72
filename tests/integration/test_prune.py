"""`tfdeploy prune` on two lab hosts after a few `up`s: what it frees, what stays, and that a
detached run still running survives it with what it uses."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.lab_cli import tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

LEASE_S = 5  # a finished `up`'s lease lapses this soon after (a live lease keeps its run)
# A workdir of the test's own: the session's lab hosts hold other tests' runs and contents in
# ~/.tfdeploy, which a prune there would count (and free).
WORKDIR = f"~/.tfdeploy-prune-{uuid.uuid4().hex[:8]}"


def on_host(lab: Lab, host: Any, command: str) -> list[str]:
    done = subprocess.run(
        lab.ssh_argv(host, command), capture_output=True, text=True, timeout=60, check=True
    )
    return sorted(done.stdout.split())


def runs_on(lab: Lab, host: Any) -> list[str]:
    return on_host(lab, host, f"ls {WORKDIR}/hosts/*/runs")


def store_of(lab: Lab, host: Any) -> list[str]:
    return on_host(lab, host, f"ls {WORKDIR}/store")


def test_prune_frees_old_runs_and_their_contents_and_spares_a_running_run(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    lab = clean_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.py").write_text("import time\nwhile True:\n    time.sleep(0.5)\n")
    job = {
        "lease_seconds": LEASE_S,
        "stop_grace": 2,
        "require_tensorflow": False,
        "workdir": WORKDIR,
    }
    done = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job=job | {"name": "once", "command": f"{lab.python} -c 'print(1)'"},
        name="once.toml",
    )
    ticking = lab_inventory(
        [[{"role": "worker"}], [{"role": "worker"}]],
        code=code,
        job=job | {"name": "ticks", "command": f"{lab.python} tick.py"},
        name="ticks.toml",
    )
    state = tmp_path / "state"
    hosts = lab.hosts[:2]
    try:
        for i in range(3):  # each run's code has a content of its own (version.txt)
            (code / "version.txt").write_text(f"version {i}\n")
            tfdeploy("up", str(done), state=state, check_rc=0)
        up = tfdeploy("up", "--detach", str(ticking), state=state, check_rc=0)
        found = re.search(r"run (ticks-\S+) is running detached", up.stdout)
        assert found, up.stdout
        detached = found.group(1)
        stores = {h.name: store_of(lab, h) for h in hosts}
        assert {len(s) for s in stores.values()} == {4}  # tick.py and three versions
        time.sleep(LEASE_S + 1)

        said = tfdeploy("prune", str(done), "--keep", "1", "--grace", "0", "--dry-run", state=state)
        assert said.returncode == 0, said.stderr
        for h in hosts:
            assert f"{h.name}: would free 2 runs, 2 contents and 0 environments" in said.stdout
            assert len(runs_on(lab, h)) == 4 and store_of(lab, h) == stores[h.name]

        pruned = tfdeploy("prune", str(done), "--keep", "1", "--grace", "0", state=state)
        assert pruned.returncode == 0, pruned.stderr
        for h in hosts:
            assert f"{h.name}: freed 2 runs, 2 contents and 0 environments" in pruned.stdout
            left = runs_on(lab, h)
            assert len(left) == 2 and detached in left  # the newest of each job
            assert len(store_of(lab, h)) == 2  # tick.py and the newest version
        assert "freed" in pruned.stdout.splitlines()[-1] and "4 runs on 2 hosts" in pruned.stdout

        # Keep none: the detached run still runs, so it stays, with its code's contents.
        pruned = tfdeploy("prune", str(done), "--keep", "0", "--grace", "0", state=state)
        assert pruned.returncode == 0, pruned.stderr
        for h in hosts:
            assert f"{h.name}: freed 1 run, 0 contents" in pruned.stdout
            assert f"kept 1 run that may still run ({detached})" in pruned.stdout
            assert runs_on(lab, h) == [detached] and len(store_of(lab, h)) == 2
        status = tfdeploy("status", str(ticking), state=state, check_rc=0).stdout
        assert "running" in status

        tfdeploy("down", str(ticking), state=state, check_rc=0)
        pruned = tfdeploy("prune", str(ticking), "--keep", "0", "--grace", "0", state=state)
        assert pruned.returncode == 0, pruned.stderr
        for h in hosts:
            assert f"{h.name}: freed 1 run, 2 contents and 0 environments" in pruned.stdout
            assert runs_on(lab, h) == [] and store_of(lab, h) == []
    finally:  # nothing of the test outlives it, whatever failed
        tfdeploy("down", str(ticking), state=state)
        for h in hosts:
            subprocess.run(lab.ssh_argv(h, f"rm -rf {WORKDIR}"), timeout=60, check=False)
