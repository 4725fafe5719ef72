"""The lab's non-root login user: most real fleets are reached as `ubuntu` or `ec2-user`, not root.

Lab hosts share this machine's /etc/passwd, so the user is made once on the machine (and kept,
like /opt/tfdeploy/pythons). Each host mounts its own home over the user's home directory; a
lab can instead mount one directory there on every host, like an NFS or EFS home.
"""

from __future__ import annotations

import fcntl
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.lab.model import LabError, LabUnsupported

LOGIN_USER = "tfdlab"
_LOCK = Path("/var/tmp/tfdeploy-lab-user.lock")


@dataclass(frozen=True)
class LoginUser:
    """An unprivileged account lab hosts accept key logins for."""

    name: str
    uid: int
    gid: int
    home: str


def _locked_in_shadow(name: str) -> bool:
    """`useradd` leaves `!` in the password field: sshd then refuses even key logins."""
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields[1].startswith("!")
    return False


def ensure_login_user(name: str = LOGIN_USER) -> LoginUser:
    """The user `name`, created (home, /bin/sh, unlocked, no password) if it is not there yet."""
    try:
        with open(_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs starting at once make it once
            try:
                pwd.getpwnam(name)
            except KeyError:
                _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name])
            if _locked_in_shadow(name):
                _run(["usermod", "--password", "*", name])  # '*': no password, not locked
    except PermissionError as e:
        raise LabUnsupported(f"making the lab user {name!r} needs root: {e}") from e
    entry = pwd.getpwnam(name)
    Path(entry.pw_dir).mkdir(mode=0o700, exist_ok=True)  # the mount point of the hosts' homes
    return LoginUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
