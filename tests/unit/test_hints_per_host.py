"""Hints from several hosts at the CLI edge: one `hint:` line each, naming its hosts, in the
order the hosts failed, a hint many hosts share folded into one line."""

from __future__ import annotations

from pathlib import Path

from deployer.core.errors import HostError, HostsFailed
from tests.support.helpers import run_cli

SSHD = "is sshd running and listening on port {}?"


def test_check_of_hosts_refusing_ssh_gives_one_hint_per_line_naming_hosts(tmp_path: Path) -> None:
    """Real connections to closed ports of this machine: refused at once."""
    hosts = [("a", "127.0.0.1", 1), ("b", "127.0.0.2", 22222), ("c", "127.0.0.3", 1)]
    text = f'[job]\nname = "h"\ncode = "{tmp_path}"\ncommand = "true"\n'
    for name, address, port in hosts:
        text += (
            f'[[hosts]]\nname = "{name}"\naddress = "{address}"\n'
            f'ssh = {{ port = {port}, connect_timeout = 5 }}\ntasks = [{{ role = "worker" }}]\n'
        )
    (tmp_path / "inv.toml").write_text(text)
    code, _, err = run_cli("check", str(tmp_path / "inv.toml"))
    assert code == 3, err
    hints = [line for line in err.splitlines() if line.startswith("hint:")]
    assert hints == [f"hint: a and c: {SSHD.format(1)}", f"hint: b: {SSHD.format(22222)}"], err


def test_many_hosts_sharing_a_hint_are_counted_and_hosts_keep_their_order() -> None:
    failures = [HostError(f"h{i}", "connection refused", hint=SSHD.format(22)) for i in range(12)]
    failures.insert(0, HostError("z", "no python3", hint="install python3\nor set python"))
    failures.append(HostError("y", "timed out"))  # no hint: no line
    error = HostsFailed(failures)
    assert error.hint == (
        "z: install python3\nz: or set python\n12 hosts: is sshd running and listening on port 22?"
    )
