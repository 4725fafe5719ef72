"""A notice becomes a checkpoint (issue 59): a spot interruption notice reaches the task as the
SIGTERM TensorFlow's PreemptionCheckpointHandler listens for (examples/digits/mwms.py), every
worker saves a checkpoint at the same step before the kill, and the next attempt resumes from it.

EC2 is moto, the spot instances are lab hosts (discovered, so they stay: no replacement), and
the metadata service is the stand-in of tests/fakes/imds.py, whose notice is served once. The
Slurm warning reaches the same handler as SIGUSR1 (docs/slurm.md; the relay is tested in
tests/integration/test_slurm.py).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.imds import Imds
from tests.lab import Lab
from tests.lab.base import wait_until
from tests.lab.inventory import toml_value
from tests.support.aws import EXAMPLES, REGION, cli, launch

pytestmark = [pytest.mark.lab, pytest.mark.isolated, pytest.mark.starts_tf, pytest.mark.slow]

STEPS_PER_EPOCH = 22  # 1,438 training digits in global batches of 64
SPOT_MARGIN_S = 15  # the SIGKILL comes this long before the announced time (deployer/up/start.py)


@pytest.fixture
def imds(lab: Lab) -> Iterator[Imds]:
    """The metadata service stand-in, on this machine's address on the lab's bridge."""
    network = ipaddress.ip_network(f"{lab.hosts[0].address}/24", strict=False)
    with Imds(str(network.network_address + 1)) as stand_in:
        yield stand_in


def test_a_spot_notice_is_saved_as_a_checkpoint_the_next_attempt_resumes_from(
    lab: Lab, ec2: Any, imds: Imds, tmp_path: Path
) -> None:
    h1, doomed = lab.hosts[:2]
    job = f"notice{secrets.token_hex(3)}"
    network = ipaddress.ip_network(f"{h1.address}/16", strict=False)
    vpc = ec2.create_vpc(CidrBlock=str(network))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=str(network))["Subnet"]["SubnetId"]
    ids = {
        h.address: launch(
            ec2,
            {"tfdeploy-job": job, "tfdeploy-role": "worker"},
            SubnetId=subnet,
            PrivateIpAddress=h.address,
            InstanceMarketOptions={"MarketType": "spot"},
        )
        for h in (h1, doomed)
    }
    # Attempt 0 trains until the notice stops it (it could not finish first); attempt 1's
    # total is below the notice's step, so it restores and has nothing left to train. `exec`:
    # the shell that expands the total gives the task's process group to Python alone.
    command = f"exec {lab.python} mwms.py --epochs $(( TFDEPLOY_ATTEMPT ? 2 : 1000 ))"
    tf_env = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    ssh = {
        "user": lab.user,
        "identity": str(lab.key_path),
        "known_hosts": str(lab.known_hosts),
        "connect_timeout": 5,
    }
    path = tmp_path / "spot.toml"
    path.write_text(
        "[job]\n"
        f"name = {toml_value(job)}\ncode = {toml_value(EXAMPLES)}\n"
        f"command = {toml_value(command)}\npython = {toml_value(lab.python)}\n"
        f"env = {toml_value(tf_env)}\n"
        'checkpoint_dir = "ckpt"\non_failure = "restart-job"\nmax_restarts = 1\n'
        "restart_backoff = 0\n"
        "[ssh]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in ssh.items()) + "[aws]\n"
        f'region = "{REGION}"\nmetadata_url = {toml_value(imds.url)}\n'
        "[[aws.hosts]]\n"
        f'filters = {{ "tag:tfdeploy-job" = "{job}", "tag:tfdeploy-role" = "worker" }}\n'
        'ssh_address = "private"\ntf_address = "private"\ntasks = [{ role = "worker" }]\n'
    )

    # The notice comes once epoch 2 is checkpointed (a collective save: by both workers):
    # what was trained after it is the notice's to save. Served once: the machine stays, and
    # attempt 1 there gets none.
    epoch_2 = f"find ~/.tfdeploy/hosts/*/jobs/{job}/ckpt -name ckpt-2.index | grep -q ."
    announced: list[float] = []

    def notice() -> None:
        wait_until(
            "epoch 2 checkpointed",
            lambda: lab.run(doomed, ["sh", "-c", epoch_2]).returncode == 0,
            timeout=300,
            interval=0.2,
        )
        announced.append(imds.notice(seconds_from_now=90, only=doomed.address, once=True))

    noticer = threading.Thread(target=notice, daemon=True)
    noticer.start()
    code, out, err = cli("up", str(path))
    noticer.join(5)
    assert code == 0, f"{out}\n{err}"
    [at] = announced
    [served] = imds.served

    victim = f"@{ids[doomed.address]}"
    assert re.search(rf"^worker:\d{victim} +\| tfdeploy: spot interruption notice", out, re.M)
    # Both workers saved at one step, after epoch 2: the noticed one on its SIGTERM, its peer
    # told through the coordination service; both exited 143 and the job restarted.
    saved = re.findall(
        r"^(worker:\d)@(i-\w+) +\| \1: saved (\S+/notice/ckpt-(\d+)) at step (\d+), ", out, re.M
    )
    assert len(saved) == 2 and all(n == s for *_, n, s in saved), out
    [step] = {int(s) for *_, s in saved}
    assert step > 2 * STEPS_PER_EPOCH, out
    assert re.search(rf"^(worker:\d){victim} +\| \1: SIGTERM: a notice, saving", out, re.M), out
    assert re.search(rf"^(worker:\d){victim} +\| \1: saved on its notice, exiting 143", out, re.M)
    # The peer saved before the noticed task ended (the save is collective), so before any stop
    # of tfdeploy's; its exit line may yet say "its notice" if that stop's SIGTERM came first.
    exits = re.findall(
        r"^(worker:\d)@\S+ +\| \1: saved on (?:its|a peer's) notice, exiting 143", out, re.M
    )
    assert len(exits) == 2, out
    assert "restarting the whole job (restart 1 of 1" in out, out
    # The checkpoint was written after the notice was served and before the SIGKILL's time.
    [(_, _, where, _, _)] = [s for s in saved if f"@{s[1]}" == victim]
    written = float(lab.run(doomed, ["date", "-r", f"{where}.index", "+%s.%N"]).stdout)
    assert served < written < at - SPOT_MARGIN_S
    # Attempt 1 restored that very checkpoint on both workers.
    resumed = re.findall(
        r"^(worker:\d)@\S+ \[attempt 1\] +\| \1: resumed from (\S+) after epoch (\d+) "
        r"\(step (\d+)\), attempt 1$",
        out,
        re.M,
    )
    assert sorted((w, p) for w, p, *_ in resumed) == sorted((w, p) for w, _, p, *_ in saved), out
    assert {int(s) for *_, s in resumed} == {step}
    assert {int(e) for _, _, e, _ in resumed} == {step // STEPS_PER_EPOCH}
    assert len(re.findall(r"\[attempt 1\] +\| test_accuracy=", out)) == 2, out
    assert "job succeeded" in out, out
    for h in (h1, doomed):
        assert not lab.leftovers(h), lab.leftovers(h)
