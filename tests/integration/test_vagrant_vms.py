"""tfdeploy on real VMs: `vagrant up` from the locally built box, a real MWMS job across them, a
VM destroyed mid-run, `down`, `vagrant destroy`.

Run as root on a Linux machine with libvirt (docs/testing.md, "Vagrant"): `pytest -m vagrant`.
Skipped in the default run (it boots VMs: ~9 minutes without KVM). The VMs come from
vagrant/Vagrantfile; the job is inventories/vagrant.toml, run as a user runs it.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.config.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]
VAGRANT_DIR = REPO / "vagrant"
INVENTORY = REPO / "inventories" / "vagrant.toml"
# The checkout's tfdeploy, as every test runs it: the suite's venv holds the dependencies only
# (scripts/install.sh), never a `tfdeploy` script, and PYTHONPATH puts this checkout first.
TFDEPLOY = (sys.executable, "-m", "deployer")
KEY = REPO / ".vagrant-lab" / "id_ed25519"

pytestmark = [pytest.mark.vagrant, pytest.mark.timeout(3600)]


def libvirt_driver() -> str:
    """kvm where KVM runs a stock guest kernel; qemu (the emulator) otherwise. kvm_pvm (a
    software KVM for nested clouds) interprets every guest-kernel instruction, so a Debian
    kernel never finishes booting on it (docs/testing.md, "Vagrant")."""
    chosen = os.environ.get("TFDEPLOY_LIBVIRT_DRIVER")
    if chosen:
        return chosen
    usable = Path("/dev/kvm").exists() and not Path("/sys/module/kvm_pvm").exists()
    return "kvm" if usable else "qemu"


ENV = {
    **os.environ,
    "TFDEPLOY_LIBVIRT_DRIVER": libvirt_driver(),
    "TFDEPLOY_VM_CPUS": "1",
    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
}
HOSTS = load_inventory(INVENTORY).hosts


def run(*argv: str, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, cwd=VAGRANT_DIR, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        said = f"{result.stdout}\n{result.stderr}"
        pytest.fail(f"{' '.join(argv)} exited {result.returncode}:\n{said}")
    return result


def domains() -> list[str]:
    out = run("virsh", "list", "--all", "--name").stdout.split()
    return [d for d in out if d.startswith("vagrant_h")]


def on_vm(address: str, command: str) -> str:
    """A command as root on a VM, with the inventory's key and the host keys the test recorded."""
    known = REPO / ".vagrant-lab" / "known_hosts"
    argv = ["ssh", "-i", str(KEY), "-o", f"UserKnownHostsFile={known}", "-o", "BatchMode=yes"]
    argv += ["-o", "StrictHostKeyChecking=yes", f"root@{address}", command]
    return run(*argv, timeout=60).stdout


def nothing_left(address: str, wait: float = 15) -> list[str]:
    """tfdeploy's processes (agent, supervisors, the job) and listening ports other than sshd's
    left on a VM; a few seconds are allowed for the agent's session to end after the controller
    closed it."""
    probe = (
        "ps -eo pid,args | grep -E '[.]tfdeploy|mwms[.]py' || true; "
        "ss -Htln | awk '$4 !~ /:22$/ {print \"listening \" $4}'"
    )
    deadline = time.monotonic() + wait
    while True:
        found = [line.strip() for line in on_vm(address, probe).splitlines() if line.strip()]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


@pytest.fixture(scope="module")
def vms() -> Iterator[dict[str, float]]:
    if os.geteuid() != 0 or not shutil.which("vagrant") or not shutil.which("virsh"):
        pytest.skip("needs root, vagrant, vagrant-libvirt and libvirt (docs/testing.md: Vagrant)")
    if subprocess.run(["virsh", "version"], capture_output=True).returncode != 0:
        pytest.skip("libvirtd is not running (systemctl start libvirtd, or libvirtd -d)")
    timings: dict[str, float] = {}
    began = time.monotonic()
    run(str(VAGRANT_DIR / "build-box.sh"))
    timings["box"] = time.monotonic() - began
    try:
        began = time.monotonic()
        run("vagrant", "up", "--provider=libvirt")
        timings["vagrant up"] = time.monotonic() - began
        # Host keys read over Vagrant's own authenticated SSH, never trusted on first use.
        run(str(VAGRANT_DIR / "known-hosts.sh"))
        known = (REPO / ".vagrant-lab" / "known_hosts").read_text().splitlines()
        assert [line.split()[:2] for line in known] == [[h.address, "ssh-ed25519"] for h in HOSTS]
        yield timings
    finally:
        began = time.monotonic()
        run("vagrant", "destroy", "-f", check=False)
        timings["vagrant destroy"] = time.monotonic() - began
        print("\nvagrant test timings:", {k: round(v) for k, v in timings.items()})
        assert domains() == [], "vagrant destroy left VMs behind"


class Lines:
    """A running `tfdeploy up`'s merged output, read line by line without blocking the test."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        pytest.fail(f"no line like {pattern!r} in {timeout:g} s:\n{''.join(self.seen)}")

    def rest(self) -> str:
        while (line := self._queue.get(timeout=600)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


@pytest.mark.starts_tf
def test_mwms_trains_across_vms_and_a_destroyed_vm_is_reported_lost(vms: dict[str, float]) -> None:
    began = time.monotonic()
    up = run(*TFDEPLOY, "up", "../inventories/vagrant.toml", check=False)
    vms["tfdeploy up (training)"] = time.monotonic() - began
    assert up.returncode == 0, up.stdout + up.stderr
    accuracies = [float(a) for a in re.findall(r"test_accuracy=([\d.]+)", up.stdout)]
    assert len(accuracies) == len(HOSTS) and min(accuracies) >= 0.85, up.stdout
    assert "job succeeded" in up.stdout + up.stderr
    for host in HOSTS:
        assert nothing_left(host.address) == [], host.name

    # A VM dies mid-run: its loss is reported, the other VM's task is stopped, up fails.
    victim, survivor = HOSTS[-1], HOSTS[0]
    began = time.monotonic()
    proc = subprocess.Popen(
        [*TFDEPLOY, "up", "../inventories/vagrant.toml"],
        cwd=VAGRANT_DIR,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = Lines(proc)
    lines.wait_for(r"all \d+ tasks started", timeout=600)
    assert nothing_left(survivor.address, wait=0) != []  # the probe sees a running job
    run("virsh", "destroy", f"vagrant_{victim.name}")
    lines.wait_for(rf"host {victim.name} lost after", timeout=120)
    assert proc.wait(timeout=300) != 0
    out = lines.rest()
    vms["tfdeploy up (VM destroyed)"] = time.monotonic() - began
    assert f"error: host {victim.name} was lost" in out, out
    assert nothing_left(survivor.address) == []

    down = run(*TFDEPLOY, "down", "../inventories/vagrant.toml", check=False)
    assert down.returncode != 0 and victim.name in down.stdout + down.stderr  # still gone
    assert "Traceback" not in down.stdout + down.stderr
    assert nothing_left(survivor.address) == []
