"""A login node that prints what it likes (issue 58): a `squeue` wrapper earlier on the lab login
node's PATH answers tfdeploy's queries with a hostile hostlist, reason or number, and the real
`tfdeploy up` and `tfdeploy status INVENTORY` run against it. Each must end with the documented
error (or, for a reason, show it cleaned), in bounded memory (the controller runs under a 4 GB
address-space limit; its own peak is measured, tests/support/peak_rss.py), with no control
character on the terminal, and nothing submitted.

The wrapper is bind-mounted over /usr/bin/squeue inside the login host's mount namespace only
(the machine and the other hosts keep the real one); it answers only the queries of tfdeploy's
form (`-o '%i|%T|...'`) and hands every other call (the fixture's checks) to the real squeue.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import Lab, SlurmCluster
from tests.support.helpers import to_toml
from tests.support.lab_inventories import login_ssh
from tests.support.peak_rss import measured

pytestmark = [pytest.mark.lab, pytest.mark.isolated, pytest.mark.slurm_e2e]

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
PEAK_KIB = 400 * 1024  # the controller's whole peak; expanding 10^10 names took 3.9 GB


class Wrapper:
    """The hostile squeue on the login node: `answer(line)` sets what it prints after the job
    id for tfdeploy's queries."""

    def __init__(self, slurm: SlurmCluster) -> None:
        self.slurm = slurm
        self.dir = slurm.dir / "hostile"
        self.dir.mkdir(exist_ok=True)
        self.line = self.dir / "line"
        self.real = self.dir / "squeue.real"
        self.script = self.dir / "squeue"

    def install(self) -> None:
        q = shlex.quote
        self.real.write_bytes(Path("/usr/bin/squeue").read_bytes())
        self.real.chmod(0o755)
        self.script.write_text(
            "#!/bin/sh\n"
            'case "$*" in\n'
            "*'%i|%T'*)\n"
            "  id=1; prev=\n"
            '  for a in "$@"; do [ "$prev" = "-j" ] && id=$a; prev=$a; done\n'
            f'  printf %s "$id"; cat {q(str(self.line))}; exit 0 ;;\n'
            "esac\n"
            f'exec {q(str(self.real))} "$@"\n'
        )
        self.script.chmod(0o755)
        self.answer("|PENDING|0:00|5:00|2|debug||(null)|Resources")
        done = self.slurm.login_run(f"mount --bind {q(str(self.script))} /usr/bin/squeue")
        assert done.returncode == 0, done.stderr

    def answer(self, rest: str) -> None:
        self.line.write_bytes(rest.encode() + b"\n")

    def remove(self) -> None:
        self.slurm.login_run("umount /usr/bin/squeue")


@pytest.fixture
def wrapper(slurm: SlurmCluster) -> Iterator[Wrapper]:
    w = Wrapper(slurm)
    w.install()
    try:
        yield w
    finally:
        w.remove()


@pytest.fixture
def inventory(slurm_lab: Lab, slurm: SlurmCluster, tmp_path: Path) -> Path:
    document = {
        "job": {"name": "hostile", "code": str(tmp_path), "command": "python3 -c pass"},
        "ssh": login_ssh(slurm_lab),
        "slurm": {
            "login": slurm.login.address,
            "partition": "debug",
            "time": "00:05:00",
            "hosts": [{"nodes": 2, "tasks": [{"role": "worker"}]}],
        },
    }
    path = tmp_path / "slurm.toml"
    path.write_text(to_toml(document))
    return path


def _tfdeploy(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """(exit status, everything printed, peak RSS in KiB) of the real CLI."""
    env = os.environ | {"TFDEPLOY_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    done = measured([sys.executable, "-m", "deployer", *args], env, timeout=120)
    return done.returncode, done.output, done.rss_kib


def _clean(output: str) -> None:
    assert CONTROL.search(output) is None, repr(output)
    assert "Traceback" not in output and "internal error" not in output, output


@pytest.mark.parametrize(
    "rest,problem",
    [
        ("|RUNNING|0:05|4:55|2|debug|h[0-9999999999]|(null)|None", "more than 100000 names"),
        ("|RUNNING|0:05|4:55|2|debug|h[-]|(null)|None", "a range '-'"),
        ("|RUNNING|0:05|4:55|²|debug|h[2-3]|(null)|None", "a node count '²'"),
        ("|RUNNING|0:05|4:55|" + "1" * 5000 + "|debug|h[2-3]|(null)|None", "a node count"),
    ],
)
def test_a_hostile_squeue_answer_is_the_documented_error_in_bounded_memory(
    wrapper: Wrapper, inventory: Path, slurm: SlurmCluster, tmp_path: Path, rest: str, problem: str
) -> None:
    wrapper.answer(rest)
    for verb in ("up", "status"):
        rc, output, peak = _tfdeploy(tmp_path, verb, str(inventory))
        assert rc == 3, (verb, output)
        assert "printed what tfdeploy cannot read" in output and problem in output, output
        _clean(output)
        assert peak < PEAK_KIB, f"{verb} peaked at {peak} KiB"
    wrapper.remove()
    assert slurm.jobs() == [], "up submitted an allocation"
    wrapper.install()


def test_a_hostile_pending_reason_reaches_status_and_up_clean(
    wrapper: Wrapper, inventory: Path, slurm: SlurmCluster, tmp_path: Path
) -> None:
    reason = "Resources\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZWNobyBvd25lZA==\x07\x9b31mred\u202e"
    wrapper.answer(f"|PENDING|0:00|5:00|2|debug||(null)|{reason}")
    rc, output, _ = _tfdeploy(tmp_path, "status", str(inventory))
    assert rc == 0, output
    assert "pending (Resourcesred" in output, output
    _clean(output)
    assert "\u202e" not in output
    rc, output, _ = _tfdeploy(tmp_path, "up", str(inventory))
    assert rc == 2 and "the job already has allocation 1" in output, output
    _clean(output)
    wrapper.remove()
    assert slurm.jobs() == []
    wrapper.install()
