"""Container hosts in the namespace lab: what THIS machine needs to run podman inside a lab host.

None of this is tfdeploy's: a real host runs a stock podman. The lab provides what this machine's
kernel and the lab's namespaces need (../shared/CONTAINER_NOTES.md, docs/containers.md):
- one `containers.conf` per lab: runc (crun refuses the hybrid cgroup layout), no default
  ulimits (podman's exceed what root may set here), cgroupfs and a file event log (lab hosts run
  no systemd). Every SSH session of a container host gets it through sshd's `SetEnv`.
- per host: its own image store (a `storage.conf` with graphroot on disk in the lab directory,
  runroot in the host's private /root, so a crash and revive is a reboot), the cgroup v1
  hierarchies on a tmpfs at /sys/fs/cgroup (`ip netns exec` remounted /sys without them) and a
  private /run/libpod (podman's tmp_dir, else shared by every host of the machine).
- a registries.conf per lab: no short-name search; a registry a test runs on the lab is added
  as insecure (plain HTTP) by `trust_registry`.
- a tiny test image: a busybox-static root file system, its tarball built once and cached.
"""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.lab.model import LabUnsupported

CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

_CGROUPS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")
RUNROOT = "/root/.lab-containers-run"
IMAGE_CACHE = Path("/var/tmp/tfdeploy-images")
BUSYBOX = Path("/bin/busybox")
TEST_IMAGE = "localhost/tfdeploy-test/busybox:1"

# The lab's registries.conf: no registry to search for short names (none is reachable from
# here); a test that runs a registry on the lab adds it (`insecure_registry`).
REGISTRIES_CONF = "unqualified-search-registries = []\n"


def insecure_registry(address: str) -> str:
    """registries.conf's entry letting podman pull from `address` over plain HTTP."""
    return f'\n[[registry]]\nlocation = "{address}"\ninsecure = true\n'


def storage_conf(graphroot: Path) -> str:
    """vfs: no overlay mounts to leak or to stack on the lab's tmpfs homes."""
    return f'[storage]\ndriver = "vfs"\ngraphroot = "{graphroot}"\nrunroot = "{RUNROOT}"\n'


def boot_lines() -> list[str]:
    """Shell lines of a container host's boot script, run in its own mount namespace."""
    lines = ["mount -t tmpfs -o mode=0755 lab-cgroup /sys/fs/cgroup"]
    for ctrl in _CGROUPS:
        lines.append(
            f"mkdir /sys/fs/cgroup/{ctrl} && mount -t cgroup -o {ctrl} cgroup /sys/fs/cgroup/{ctrl}"
        )
    lines.append("mkdir /sys/fs/cgroup/systemd")
    lines.append("mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd")
    lines.append("mkdir -p /run/libpod && mount -t tmpfs -o mode=0700 lab-libpod /run/libpod")
    return lines


def available() -> str | None:
    """None when podman can run containers here, else why not (the tests skip with it)."""
    missing = [p for p in ("podman", "runc", "catatonit") if shutil.which(p) is None]
    if missing:
        return f"not installed: {' '.join(missing)} (scripts/install.sh installs them as root)"
    if not _busybox_static():
        return f"{BUSYBOX} is not a static busybox (apt-get install busybox-static)"
    return None


def _busybox_static() -> bool:
    """A dynamic busybox names its loader (ld-linux) near the start; a static one has none."""
    try:
        head = BUSYBOX.read_bytes()[:65536]
    except OSError:
        return False
    return head.startswith(b"\x7fELF") and b"ld-linux" not in head


def test_image_tar() -> Path:
    """A root file system tarball of busybox-static (~2 MB), cached under /var/tmp by the
    binary's digest: built once per machine, byte-identical every time (so is its image ID)."""
    reason = available()
    if reason is not None:
        raise LabUnsupported(reason)
    data = BUSYBOX.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    out = IMAGE_CACHE / f"busybox-rootfs-{digest}.tar"
    if out.exists():
        return out
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # xdist workers may build it at once
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for d, mode in (
            ("bin", 0o755),
            ("etc", 0o755),
            ("tmp", 0o1777),
            ("proc", 0o555),
            ("sys", 0o555),
            ("dev", 0o755),
            ("root", 0o700),
        ):
            tar.addfile(_info(d, tarfile.DIRTYPE, mode))
        tar.addfile(_info("bin/busybox", tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for name in sorted(set(applets.stdout.split()) - {"busybox"}):
            link = _info(f"bin/{name}", tarfile.SYMTYPE, 0o777)
            link.linkname = "busybox"
            tar.addfile(link)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        tar.addfile(_info("etc/passwd", tarfile.REGTYPE, 0o644, len(passwd)), io.BytesIO(passwd))
    tmp.rename(out)
    return out


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    return info


def ps_args() -> str:
    """podman's arguments listing every tfdeploy container on a host (any run: the label is
    set), one `name status` line each."""
    fmt = shlex.quote("{{.Names}} {{.Status}}")
    return f"ps -a --filter label=tfdeploy.run --format {fmt}"
