"""Hostile reply fields end to end, on the lab (issue 47): a patched agent
(tests/support/hostile.py) or a hostile nvidia-smi stand-in answers what the reply edge
(deployer/hosts/replies.py, reply_bounds.py) must parse into bounded values. The walk over every
field of every shape is in-process (tests/unit/test_reply_walk.py); here the verbs a user runs
show that one host's bad field is that host's error, named, never an internal error, never
another host's silence, never a control character on the terminal, never the controller's
memory.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab import Lab
from tests.support.gpus import install as install_fake_nvidia_smi
from tests.support.gpus import state as nvidia_smi_state
from tests.support.hostile import Hostile, hostile_run, no_control_characters
from tests.support.lab_cli import tfdeploy
from tests.support.peak_rss import measured
from tests.support.wheels import make_wheel

pytestmark = [pytest.mark.lab]

TASK = 'print("done", flush=True)\n'
# A task status's disk_full as a hostile host writes it: OSC 52 (the clipboard), CSI 2J (clear
# the screen) and its C1 form, around the file system's name. Python source for the patch.
DISK_FULL = "'\\x1b]52;c;UFdORUQ=\\x07/dev/sda1\\x1b[2J\\u009b2J'"
NVIDIA_SMI_PER_HOST = "a different nvidia-smi stand-in on each host, in root's own home"


@pytest.fixture
def hostile(lab: Lab, tmp_path: Path) -> Iterator[Hostile]:
    with hostile_run(lab, tmp_path, TASK) as run:
        yield run


@pytest.fixture
def hostile_pair(lab: Lab, tmp_path: Path) -> Iterator[Hostile]:
    """A run on two hosts: the first one's agent is patched, the second one answers honestly."""
    with hostile_run(lab, tmp_path, TASK, hosts=2) as run:
        yield run


def test_a_disk_full_text_reaches_status_cleaned(hostile: Hostile) -> None:
    """`disk_full` was the one text of a task status not cleaned: ESC, OSC 52, CSI 2J and C1
    reached `status`'s terminal."""
    hostile.patch(
        {
            "procs.py": [
                (
                    '        "disk_full": ended.get("disk_full"),',
                    f'        "disk_full": {DISK_FULL},',
                )
            ]
        }
    )
    result = hostile.tfdeploy("status", str(hostile.inventory))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "/dev/sda1" in output, output  # the text itself is shown, cleaned
    no_control_characters(output)
    assert "UFdORUQ" not in output  # the clipboard's payload went with its sequence
    assert "Traceback" not in output


@pytest.mark.parametrize("created", ["1e20", "float('nan')", "float('inf')"])
def test_a_hostile_run_time_is_that_hosts_error_and_the_other_host_still_answers(
    hostile_pair: Hostile, created: str
) -> None:
    """`created` of 1e20, NaN or inf made `status` die with `internal error: OverflowError`
    and hid the other host's answer."""
    bad, good = (h.name for h in hostile_pair.hosts)
    hostile_pair.patch(
        {
            "agent.py": [
                ('                "created": created,', f'                "created": {created},')
            ]
        }
    )
    result = hostile_pair.tfdeploy("status", str(hostile_pair.inventory))
    output = result.stdout + result.stderr
    assert "internal error" not in output and "Traceback" not in output, output
    assert result.returncode == 3, output
    assert f"{bad}: its agent's hello reply is not valid: runs[0].created is" in output, output
    # the honest host's task is still shown
    assert re.search(rf"│ worker:1 │ {good} +│ +\d+ │ exited 0 ", result.stdout), output
    no_control_characters(output)


def test_a_hello_claiming_a_huge_glibc_is_refused_in_seconds_without_the_memory(
    hostile: Hostile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """glibc "2.999999999" made `up` list about 10^9 platform tags for pip: 8-20 GB of the
    controller's memory until the machine ran out. Now the hello is refused, the host named, in
    seconds. The controller runs under a 4 GB address-space limit so that a regression fails
    here instead of taking the machine; its peak is its own, not the pytest worker's it was
    forked from (tests/support/peak_rss.py)."""
    hostile.patch(
        {"agent.py": [('        "glibc": hostfacts.glibc(),', '        "glibc": "2.999999999",')]}
    )
    wheels = tmp_path / "index"
    make_wheel(wheels, "tinypkg")
    code = tmp_path / "code"
    (code / "requirements.txt").write_text("tinypkg==1.0\n")
    job = {
        "name": "hostile",
        "code": str(code),
        "command": "python3 task.py",
        "requirements": "requirements.txt",
        "require_tensorflow": False,
    }
    inventory = hostile.lab.write_inventory(
        tmp_path / "requirements.toml",
        tasks=[[{"role": "worker"}]],
        job=job,
        hosts=hostile.hosts,
        per_host={name: {"workdir": w} for name, w in hostile.workdirs.items()},
    )
    env = os.environ | {
        "TFDEPLOY_STATE_DIR": str(hostile.state),
        "COLUMNS": "200",
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    run = measured([sys.executable, "-m", "deployer", "up", str(inventory)], env)
    output = run.output
    assert run.returncode == 3, output
    assert (
        f"{hostile.host}: its agent's hello reply is not valid: glibc is '2.999999999', "
        "not a glibc version" in output
    ), output
    assert run.rss_kib < 200 * 1024, f"the controller peaked at {run.rss_kib // 1024} MB"


@pytest.fixture
def gpu_inventory(lab: Lab, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(inventory, host): one worker on a host with `gpus = "auto"`; the test puts its own
    nvidia-smi stand-in on that host (tests/support/gpus.py), removed afterwards."""
    host = lab.hosts[0]
    code = tmp_path / "code"
    code.mkdir()
    (code / "x.py").write_text("print('never')\n")
    path = lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}]],
        job={"name": "gpuedge", "code": str(code), "command": f"{lab.python} x.py"},
        hosts=[host],
    )
    text = path.read_text()
    path.write_text(text.replace(f'name = "{host.name}"', f'name = "{host.name}"\ngpus = "auto"'))
    try:
        yield path, host.name
    finally:
        lab.run(host, "rm -rf /root/bin")


@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_nvidia_smi_listing_one_gpu_index_twice_is_refused(
    lab: Lab, gpu_inventory: tuple[Path, str], tmp_path: Path
) -> None:
    """Two GPUs with index 0 passed: `gpus = "auto"` then planned GPUs 0 and 1."""
    inventory, host = gpu_inventory
    install_fake_nvidia_smi(lab, lab.hosts[0], nvidia_smi_state(2, gpus={1: {"index": "0"}}))
    result = tfdeploy("check", str(inventory), state=tmp_path / "state", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert f"{host}: its agent's gpus reply is not valid: gpus list the GPU index 0 twice" in output
    assert "Traceback" not in output


@pytest.mark.isolated(reason=NVIDIA_SMI_PER_HOST)
def test_nvidia_smi_numbers_that_are_no_numbers_do_not_fail_the_agent(
    lab: Lab, gpu_inventory: tuple[Path, str], tmp_path: Path
) -> None:
    """`1e400`, `inf` or `²` from nvidia-smi gave `the agent failed: OverflowError`: such a
    value is now not reported, and the GPUs are still seen."""
    inventory, _ = gpu_inventory
    odd = {
        0: {"memory.total": "inf", "memory.used": "1e400"},
        1: {"utilization.gpu": "²", "memory.total": "-inf"},
    }
    install_fake_nvidia_smi(lab, lab.hosts[0], nvidia_smi_state(2, gpus=odd))
    result = tfdeploy("check", str(inventory), state=tmp_path / "state", timeout=120)
    output = result.stdout + result.stderr
    assert "the agent failed" not in output and "Traceback" not in output, output
    assert result.returncode == 0, output


def test_exec_prints_a_hosts_output_cleaned(lab: Lab, tmp_path: Path) -> None:
    """`exec` printed host output raw: OSC 52 wrote the user's clipboard, on a pipe as on a
    terminal."""
    code = tmp_path / "code"
    code.mkdir()
    inventory = lab.write_inventory(
        tmp_path / "inventory.toml",
        tasks=[[{"role": "worker"}]],
        job={"name": "execedge", "code": str(code), "command": "true"},
        hosts=[lab.hosts[0]],
    )
    said = r"printf '\033]52;c;ZWNobw==\033\\before\033[2Jafter\302\233J\n'"
    result = tfdeploy("exec", str(inventory), "--", said, state=tmp_path / "state", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"{lab.hosts[0].name} | beforeafter" in output, output
    assert "ZWNobw" not in output
    no_control_characters(output)
