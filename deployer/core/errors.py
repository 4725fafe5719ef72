"""The few typed errors tfdeploy raises; only the CLI turns them into messages and exit codes."""

from __future__ import annotations

import enum

from deployer.core.text import join_names, plural


class ExitStatus(enum.IntEnum):
    """Exit codes shared by every command, so scripts can tell the failure classes apart."""

    OK = 0
    JOB_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    # `pull`: every other file arrived, but some it listed did not, each named (they changed
    # while they were sent: a task still writing them, pulling again may get them; or their
    # host could not read them: a path past PATH_MAX, no permission).
    INCOMPLETE = 4
    # `pull`: no pattern matched a file on any task asked: nothing came (a typo, a path relative
    # to the wrong place, or a run that has not written it yet).
    NOTHING_MATCHED = 5
    INTERRUPTED = 130
    # stdout was a pipe whose reader went away (`tfdeploy logs RUN | head -1`): 128 + SIGPIPE,
    # what a shell reports for tools that die of SIGPIPE; tfdeploy exits quietly instead.
    BROKEN_PIPE = 141


class TfdeployError(Exception):
    """Base class: an expected failure with a message for the user and an optional hint."""

    exit_status = ExitStatus.JOB_FAILED
    # The run the failure belongs to, once one was started: the Python API sets it, so a
    # caller can still read that run's logs (`deployer.api.attach(error.run_id)`).
    run_id: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(TfdeployError):
    """The command line itself is wrong (unknown run id, bad flag combination)."""

    exit_status = ExitStatus.USAGE


class InventoryError(TfdeployError):
    """An inventory file is wrong; the message names the file, the key path and what is expected."""

    exit_status = ExitStatus.USAGE

    def __init__(self, path: str, key: str, expected: str, *, hint: str | None = None) -> None:
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {expected}", hint=hint)
        self.path = path
        self.key = key
        self.expected = expected


class LocalError(TfdeployError):
    """A file or folder on this machine could not be written (a full or read-only disk, a file
    where a folder goes): the user's to fix here, so not "a host is unreachable". The message
    names the local path and the cause."""

    exit_status = ExitStatus.USAGE


class NothingMatched(TfdeployError):
    """`pull`'s patterns named no file on any task it asked: not a success a script may take for
    one (exit 5), and no host's fault either."""

    exit_status = ExitStatus.NOTHING_MATCHED


class HostError(TfdeployError):
    """A host could not be reached or failed a check; nothing was started because of it."""

    exit_status = ExitStatus.UNREACHABLE

    def __init__(
        self,
        host: str,
        cause: str,
        *,
        hint: str | None = None,
        code: str | None = None,
        subject: str | None = None,
    ) -> None:
        super().__init__(f"{host}: {cause}", hint=hint)
        self.host = host
        self.cause = cause
        self.code = code  # an agent's failure reply: its protocol.FAIL_* code, matched, not `cause`
        self.subject = subject  # what that failure is about, where its code needs it

    def of_host(self, host: str) -> HostError:
        """This failure said of `host`: where one connection serves several hosts (a Slurm
        login node's, which every node's job steps share), each host counts a failure of it
        as its own (the watch's contact, teardown and the messages go by the name)."""
        said = type(self).__new__(type(self))  # its class kept: HostKeyRefused stays one
        said.__dict__.update(self.__dict__)
        said.host = host
        said.message = f"{host}: {self.cause}"
        said.args = (said.message,)
        return said


class HostKeyRefused(HostError):
    """A host's SSH key was not the one expected (unknown, changed, or not the one its cloud
    console listed): never worth a retry, whatever else is still waiting for the host."""


class HostsFailed(TfdeployError):
    """Several hosts failed at once (preflight, push, exec); carries one HostError per host.

    `outcome` says what the failure meant for the verb as a whole: "nothing was started" for
    `up`'s phases before any start, something else for `down` or `exec`, None for reads.
    """

    exit_status = ExitStatus.UNREACHABLE

    def __init__(
        self,
        failures: list[HostError],
        *,
        what: str = "preflight failed",
        outcome: str | None = "nothing was started",
    ) -> None:
        lines = "\n".join(f"  {f.message}" for f in failures)
        head = f"{what} on {plural(len(failures), 'host')}" + (f"; {outcome}" if outcome else "")
        super().__init__(f"{head}:\n{lines}", hint=per_host_hints(failures) or None)
        self.failures = failures


def per_host_hints(failures: list[HostError]) -> str:
    """One line per distinct hint, each naming its hosts, in the order the hosts failed; a hint
    many hosts share is one line ("12 hosts: is sshd running ...?"): the CLI prints each line
    as a `hint:` of its own."""
    hosts: dict[str, list[str]] = {}
    for f in failures:
        if f.hint:
            for line in f.hint.splitlines():
                named = hosts.setdefault(line, [])
                if f.host not in named:
                    named.append(f.host)
    return "\n".join(f"{_hosts_named(names)}: {hint}" for hint, names in hosts.items())


def _hosts_named(names: list[str]) -> str:
    """'h1', 'h1 and h2', 'h1, h2 and h3'; more than three: '12 hosts'."""
    if len(names) > 3:
        return plural(len(names), "host")
    return join_names(names)


class NetworkBlocked(TfdeployError):
    """Preflight's network check: TF connections between hosts that cannot be made."""

    exit_status = ExitStatus.UNREACHABLE


class JobFailed(TfdeployError):
    """A task of the job failed or a deadline passed; the message says which task and why."""

    exit_status = ExitStatus.JOB_FAILED


class Interrupted(TfdeployError):
    """Ctrl-C, SIGTERM or SIGHUP; everything started was stopped. Exit status 128 + signal."""

    exit_status = ExitStatus.INTERRUPTED

    def __init__(self, message: str, *, hint: str | None = None, signum: int = 2) -> None:
        super().__init__(message, hint=hint)
        self.signum = signum
        self.exit_status = 128 + signum  # type: ignore[assignment]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (timeout, CI cancellation, a closed terminal): handled like
    Ctrl-C, so every started task is stopped before tfdeploy exits 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum
