"""The conventions beside TensorFlow's on the lab, through `tfdeploy up` as a user runs it: a
PyTorch DDP job (gloo) and a Keras 3 DataParallel job (JAX backend) train across two hosts with
/opt/tfdeploy/venv-frameworks as the hosts' python, each rank gets its variables, and the
weights' checksum, equal on both ranks only when the collective worked, is compared.

The torch test runs in the lab tier where the venv exists (scripts/install.sh makes it); the
Keras-JAX one (~2 min of CPU per rank) runs only with `-m frameworks` (docs/testing.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.lab import Lab
from tests.support.faults import final_states, tfdeploy

pytestmark = [pytest.mark.lab, pytest.mark.slow]

VENV = Path("/opt/tfdeploy/venv-frameworks")
PYTHON = str(VENV / "bin" / "python")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"
TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
KERAS_VARS = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)

needs_venv = pytest.mark.skipif(
    not Path(PYTHON).exists(), reason=f"needs {VENV} (scripts/install.sh makes it)"
)


def _echo(names: tuple[str, ...]) -> str:
    """A shell line that prints the task's variables before its script starts."""
    return "echo vars " + " ".join(f"{n}=${n}" for n in names)


def _vars(out: str) -> dict[str, dict[str, str]]:
    """task name -> the variables it printed."""
    found = {}
    for task, words in re.findall(r"(\w+:\d+)@\S+ +\| vars (.*)", out):
        found[task] = dict(w.partition("=")[::2] for w in words.split())
    return found


def _checksums(out: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+:\d+)@\S+ +\| weights checksum (\S+)", out))


# A lab host's name resolves to nothing: gloo (torch's and JAX's CPU collectives) would then
# bind its mesh to loopback and tell the peers 127.0.0.1 (measured). The lab's hosts each have
# eth0; docs/frameworks.md says when a user needs this line.
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}


def _framework_job(lab_inventory: Any, framework: str, command: str, **job: Any) -> Path:
    """Two workers, one per host, running `command` in examples/frameworks."""
    path: Path = lab_inventory(
        [[{"role": "worker"}]] * 2,
        code=EXAMPLES,
        job={
            "name": f"fw-{framework}",
            "framework": framework,
            "command": command,
            "python": PYTHON,  # the hello, preflight's checks and `python` in commands: the venv
            "env": GLOO_ENV,
            **job,
        },
    )
    return path


@needs_venv
def test_torch_ddp_trains_across_two_hosts_with_torchrun_variables(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    h1, h2 = clean_lab.hosts[:2]
    inventory = _framework_job(
        lab_inventory,
        "torch",
        f"{_echo((*TORCH_VARS, 'TF_CONFIG'))}; exec python torch_ddp.py --steps 30",
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=400)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    seen = _vars(out)
    assert set(seen) == {"worker:0", "worker:1"}, out
    for rank, task in enumerate(("worker:0", "worker:1")):
        assert seen[task]["RANK"] == str(rank)
        assert seen[task]["WORLD_SIZE"] == "2"
        assert seen[task]["LOCAL_RANK"] == "0" and seen[task]["LOCAL_WORLD_SIZE"] == "1"
        assert seen[task]["MASTER_ADDR"] == h1.address  # rank 0's host
        assert seen[task]["MASTER_PORT"] == seen["worker:0"]["MASTER_PORT"]
        assert seen[task]["TF_CONFIG"] == ""  # no TensorFlow convention for a torch rank
    sums = _checksums(out)
    assert set(sums) == {"worker:0", "worker:1"} and len(set(sums.values())) == 1, out
    assert h2.name in out


@needs_venv
def test_torch_restart_job_restarts_every_rank(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """Rank 1 fails on its first attempt only (TFDEPLOY_ATTEMPT): the whole job restarts and
    both ranks of attempt 1 meet again at the coordinator and train."""
    command = (
        'exec python torch_ddp.py --steps 10 --fail-rank "$(( TFDEPLOY_ATTEMPT == 0 ? 1 : -1 ))"'
    )
    inventory = _framework_job(
        lab_inventory,
        "torch",
        command,
        on_failure="restart-job",
        retry_exit_codes=[1],
        restart_backoff=1,
        stop_grace=2,
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=400)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    assert "restarting the whole job (restart 1 of" in out, out
    sums = re.findall(r"\[attempt 1\] \| weights checksum (\S+)", out)
    assert len(sums) == 2 and len(set(sums)) == 1, out
    states = final_states(inventory, _run_id(out), tmp_path, hosts=2)
    got = {k: (t["exit_code"], t["restarts"], t.get("reason")) for k, t in states.items()}
    assert all(t["exit_code"] == 0 and t["restarts"] == 1 for t in states.values()), got


def _run_id(out: str) -> str:
    found = re.search(r"\(run (\S+)\)$", out, re.MULTILINE)
    assert found, out
    return found.group(1)


@needs_venv
def test_a_torch_script_under_the_tensorflow_convention_names_the_framework_key(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    inventory = _framework_job(
        lab_inventory,
        "tensorflow",
        "exec python torch_ddp.py --steps 5",
        require_tensorflow=False,
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "environment variable RANK expected, but not set" in out  # torch's own words
    assert 'framework = "torch"' in out, out  # tfdeploy's hint


def test_preflight_refuses_a_torch_job_whose_host_python_lacks_torch(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    """The lab's own python has TensorFlow, not torch: the hello's dist-info read says so and
    nothing starts."""
    inventory = _framework_job(
        lab_inventory, "torch", "exec python torch_ddp.py", python=clean_lab.python
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    for host in clean_lab.hosts[:2]:
        assert f"{host.name}: torch is not installed for {clean_lab.python} (worker:" in out, out
    assert "nothing was started" in out, out
    assert "tasks started" not in out, out


@needs_venv
@pytest.mark.frameworks
def test_keras_dataparallel_on_jax_trains_across_two_hosts(
    clean_lab: Lab, lab_inventory: Any, tmp_path: Path
) -> None:
    h1, _ = clean_lab.hosts[:2]
    inventory = _framework_job(
        lab_inventory, "keras", f"{_echo(KERAS_VARS)}; exec python keras_jax.py --epochs 2"
    )
    result = tfdeploy("up", str(inventory), state=tmp_path / "state", timeout=600)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr}"
    seen = _vars(out)
    assert set(seen) == {"worker:0", "worker:1"}, out
    for rank, task in enumerate(("worker:0", "worker:1")):
        assert seen[task]["KERAS_DISTRIBUTION_PROCESS_ID"] == str(rank)
        assert seen[task]["KERAS_DISTRIBUTION_NUM_PROCESSES"] == "2"
        addresses = seen[task]["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")
        assert len(addresses) == 2 and addresses[0].startswith(f"{h1.address}:")
    sums = _checksums(out)
    assert set(sums) == {"worker:0", "worker:1"} and len(set(sums.values())) == 1, out
