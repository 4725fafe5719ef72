"""Keys and configuration files of a lab: sshd configs, client key, known_hosts, ssh_config."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.lab.model import LabHost


def keygen_all(paths: Iterable[Path]) -> None:
    """Make an ed25519 key at each path that has none yet (in parallel: ~5 ms each)."""
    procs = []
    for path in paths:
        if path.exists():
            continue  # a revived host keeps its key, so known_hosts stays valid
        path.parent.mkdir(parents=True, exist_ok=True)
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.parent.name, "-f"]
        procs.append(subprocess.Popen([*argv, str(path)], stdin=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"ssh-keygen failed with exit code {p.returncode}")


def sshd_config(
    *,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    listen: str,
    allow_users: Sequence[str],
    set_env: Sequence[str] = (),
    use_pam: bool = False,
) -> str:
    """An sshd_config for one lab host; every line here is one the deployer depends on.

    `set_env` ("NAME=value") goes into every session's environment (sshd's SetEnv). One
    SetEnv line holds them all: sshd takes the first SetEnv line and ignores the others.
    `use_pam`: sshd asks PAM whether a session may open (a Slurm lab's compute node behind
    pam_slurm_adopt, whose host mounts its own /etc/pam.d/sshd: tests/lab/slurm.py).
    """
    return "\n".join(
        [
            *([f"SetEnv {' '.join(set_env)}"] if set_env else []),
            f"ListenAddress {listen}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            # authorized_keys lives in the lab directory: the host's /root is a private tmpfs.
            # sshd reads it as the user logging in, so it must be readable by every login user.
            f"AuthorizedKeysFile {authorized_keys}",
            f"AllowUsers {' '.join(allow_users)}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # No PAM: hosts have no login sessions to set up, and PAM would need /etc/pam.d tweaks
            # (but a Slurm node behind pam_slurm_adopt, whose host brings its own).
            f"UsePAM {'yes' if use_pam else 'no'}",
            # Keys under /var/tmp or /tmp are not owned like ~/.ssh: StrictModes would reject them.
            "StrictModes no",
            # The deployer opens many handshakes and channels at once; defaults (10:30:100, 10)
            # would drop some of them at random.
            "MaxStartups 200",
            "MaxSessions 200",
            "Subsystem sftp internal-sftp",
            # No AcceptEnv: the deployer must pass env through its own protocol, as on AWS.
            "ClientAliveInterval 0",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "LogLevel VERBOSE",
            "",
        ]
    )


def known_hosts_line(host: LabHost, pubkey: str, *, alias: str | None = None) -> str:
    """One known_hosts line: `[addr]:port` when the port is not 22, as ssh and paramiko look up."""
    keytype, key = pubkey.split()[:2]
    names = [host.address if host.port == 22 else f"[{host.address}]:{host.port}"]
    if alias:
        names.append(alias)  # lets `ssh -o HostKeyAlias=h1` verify through a proxy address
    return f"{','.join(names)} {keytype} {key}\n"


def ssh_config(
    hosts: Iterable[LabHost],
    *,
    user: str,
    key: Path,
    known_hosts: Path,
    jump: LabHost | None = None,
    private: Iterable[str] = (),
) -> str:
    """A client config with a `Host` entry per lab host; private hosts go through the bastion."""
    private = set(private)
    out = []
    for h in hosts:
        out += [f"Host {h.name}", f"  HostName {h.address}", f"  Port {h.port}"]
        if jump is not None and h.name in private:
            out.append(f"  ProxyJump {jump.name}")
    out += [
        "Host *",
        f"  User {user}",
        f"  IdentityFile {key}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {known_hosts}",
        # Never fall back to the machine's or user's files: the lab must not depend on ~/.ssh.
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        "  ConnectTimeout 5",
        "  ControlMaster no",
        "  LogLevel ERROR",
        "",
    ]
    return "\n".join(out)
