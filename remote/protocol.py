"""What the control side and the host agent must agree on, defined once (docs/PROTOCOL.md).

Both sides import this file: the agent as a top-level module next to it on the host, the
control side as `remote.protocol`. So it stays stdlib-only and runs on Python 3.8.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

PROTOCOL_VERSION = 1

# `agent.py serve` ends a session after this long without a request, with this exit status
# (EX_TEMPFAIL): "left while idle; the request sent as it left was never read, send it again".
SERVE_IDLE_S = 15.0
SERVE_IDLE_EXIT = 75

# Set in every task's environment by the control side; a whole-run stop also ends the processes
# that left their task's process group by finding this exact value in their environment.
RUN_ID_ENV = "TFDEPLOY_RUN_ID"
TASK_ENV = "TFDEPLOY_TASK"
# The whole job's attempt (0 first; on_failure = "restart-job" starts every task again with n+1).
ATTEMPT_ENV = "TFDEPLOY_ATTEMPT"

# The host identity (hostid.py). Set by the supervisor in every task's environment, so a stop on
# one host never takes another host's processes for its own; set in the agent's environment, it
# replaces the computed identity (tests simulate several hosts sharing one workdir with it).
HOST_ID_ENV = "TFDEPLOY_HOST_ID"

# How long a port reservation taken at hello lives without a heartbeat of its run.
DEFAULT_RESERVATION_S = 60.0


def is_pushed(name: str) -> bool:
    """Every remote/*.py is pushed to hosts, except the package marker the control side needs."""
    return name.endswith(".py") and name != "__init__.py"


def agent_id(files: Iterable[tuple[str, bytes]]) -> str:
    """Content id of the agent's files: two tfdeploy versions never overwrite each other's agent.

    Fed (name, content) pairs of the pushed files; the order is fixed here, not by the caller.
    """
    digest = hashlib.sha256()
    for name, content in sorted(files):
        if is_pushed(name):
            digest.update(name.encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:12]
