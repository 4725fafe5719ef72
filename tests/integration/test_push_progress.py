"""A cold environment's push counts the bytes that travel (issue 58): the progress said "the code
and wheels: 41 kB" while 398 MB went out through the fan-out, whose stream it did not count.
Real `up` on two namespace hosts, this machine's uplink capped so that the push lasts past the
first "still ..." line, and the bytes the lab's bridge carried against what `up` said."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.core.text import human_size
from tests.lab import Lab
from tests.support.sizes import sizes_sent
from tests.support.wheels import make_wheel

pytestmark = [pytest.mark.lab, pytest.mark.isolated]  # the fan-out: hosts' own addresses


def test_a_cold_environments_push_counts_the_wheels_and_the_fan_outs_stream(
    lab: Lab, tmp_path: Path
) -> None:
    wheels = tmp_path / "index"
    wheel = make_wheel(wheels, "heavy", "1.0", files={"heavy.bin": os.urandom(3 << 20)})
    code = tmp_path / "code"
    code.mkdir()
    (code / "weights.bin").write_bytes(os.urandom(4 << 20))
    (code / "task.py").write_text(
        "from importlib.metadata import version\nprint('ok', version('heavy'))\n"
    )
    (code / "requirements.txt").write_text("heavy==1.0\n")
    hosts = lab.hosts[:2]
    inventory = lab.write_inventory(
        tmp_path / "push.toml",
        tasks=[[{"role": "worker"}]] * 2,
        hosts=hosts,
        job={
            "name": "pushcount",
            "code": str(code),
            "command": "python3 task.py",  # the venv's python3
            "requirements": "requirements.txt",
            "installer": "pip",
            "require_tensorflow": False,
            "workdir": f"~/.tfdeploy-{tmp_path.name}",  # empty stores: everything travels
        },
    )
    env = os.environ | {
        "TFDEPLOY_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "200",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    code_bytes = sum(f.stat().st_size for f in code.iterdir())
    lab.cap_uplink("8mbit")  # ~1 MB/s: the 7 MB take several seconds, past the first "still"
    try:
        before = lab.uplink_bytes()
        done = subprocess.run(
            [sys.executable, "-m", "deployer", "up", "--no-netcheck", str(inventory)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        carried = lab.uplink_bytes() - before
    finally:
        lab.uncap_uplink()
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    total = code_bytes + wheel.stat().st_size
    # Before: "the code and wheels: 7.3 kB"-like, the wheel's 3 MB left out.
    assert (
        f"the code: {human_size(code_bytes)}, the wheels and image layers: "
        f"{human_size(wheel.stat().st_size)}; only what a host lacks travels"
    ) in out, out
    # Before: the fan-out's stream was not counted: "still sending the code to 2 hosts (5 s)".
    still = re.findall(
        r"still sending the code to 2 hosts \(\d+ s\): ([\d.]+ [kMG]?B) of ([\d.]+ [kMG]?B)", out
    )
    assert still, out
    assert {of for _, of in still} == {human_size(total)}, out
    assert "fan-out: " in out and "relayed host to host to 1 host" in out, out
    said = sizes_sent(re.search(r"pushed .* sent from here", out).group(0))[0]  # type: ignore[union-attr]
    assert 0.95 * total <= said <= 1.05 * total, out  # human units: two or three digits
    # What the bridge carried: the contents once, plus SSH's and TCP's own bytes.
    assert said <= carried <= 1.3 * total, (carried, out)
    assert out.count("| ok 1.0") == 2, out  # the venv has the wheel
