"""Reach a host through another one and a launcher: a scheduler's node, as job steps.

On a Slurm cluster nobody may start a process on a node outside a job, and nodes often refuse
SSH. Every command for such a node runs on the login node (over its SSH connection, or here
when tfdeploy runs on it) wrapped in the host's launcher, `srun --jobid=J --overlap -w NODE
-N1 -n1 -u --`, which runs it as a step of the job on that node: Slurm's accounting sees it,
`scancel` ends it. A step carries stdin and stdout both ways (`-u`: unbuffered, so a reply
line or the raw bytes after it arrive at once), so the agent's request loop works over it as it
does over an SSH channel.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from deployer.core.errors import HostError
from deployer.hosts.transport import CommandResult, Session, Transport, render

# Writes stdin to a file as the transports' `put` does: private, complete or not at all. `~/`
# is the node's home (the step runs as the user, in the user's environment).
_PUT = r"""
set -e
p=$1
case $p in "~/"*) p=$HOME/${p#"~/"};; "~") p=$HOME;; esac
umask 077
mkdir -p "$(dirname "$p")"
t="$p.part-$$"
cat > "$t"
chmod "$2" "$t"
mv -f "$t" "$p"
"""


def put_with_shell(transport: Transport, data: bytes, remote_path: str, mode: int) -> None:
    """`put` as one command on `transport` (no SFTP session: a job step has none, and a shared
    connection keeps none open for it)."""
    if not remote_path.startswith(("/", "~")):
        raise ValueError(f"remote path must be absolute, not {remote_path!r}")
    argv = ["sh", "-c", _PUT, "put", remote_path, f"{mode:o}"]
    result = transport.run(argv, stdin=data, timeout=300.0)
    if result.exit_code != 0:
        said = result.stderr.decode(errors="replace").strip().splitlines()
        reason = said[-1] if said else f"exit code {result.exit_code}"
        raise HostError(transport.name, f"cannot write {remote_path}: {reason}")


class StepTransport:
    """A node's transport: every call is the login transport's, wrapped in `launcher`."""

    def __init__(self, name: str, login: Transport, launcher: Sequence[str]) -> None:
        self.name = name
        self._login = login
        self._launcher = tuple(launcher)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        render(argv)  # the same validation as a direct call
        return [*self._launcher, *argv]

    def connect(self) -> None:
        self._login.connect()

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        return self._login.run(self.wrap(argv), stdin=stdin, timeout=timeout, max_output=max_output)

    def put(self, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        put_with_shell(self, data, remote_path, mode)

    def open_session(self, argv: Sequence[str]) -> Session:
        return self._login.open_session(self.wrap(argv))

    def open_port(self, port: int) -> socket.socket:
        raise HostError(
            self.name,
            f"a tunnel to port {port} of a node reached as job steps is not supported",
            hint='set reach = "ssh" in [slurm] where the nodes accept SSH within a job '
            "(pam_slurm_adopt), or forward the port from the login node yourself",
        )

    def close(self) -> None:
        self._login.close()
