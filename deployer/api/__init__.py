"""tfdeploy from Python: the functions the `tfdeploy` command is built on, for notebooks and
pipelines (docs/api.md).

    from deployer.api import up

    result = up("inventories/local.toml")            # blocks; raises JobFailed on failure
    run = up("inventories/local.toml", detach=True)  # returns once every task runs
    run.wait(); run.logs(); run.pull(["ckpt/*"], "out"); run.down()

The names in `__all__` are the stable API: they keep their meaning and their keyword arguments
across minor versions (new keyword arguments may be added, with defaults). Everything else under
`deployer` (the submodules of this package included) is internal and may change in any release.
Nothing here prints: events go to the `view` a caller passes (`PlainView(sys.stdout)` prints what
the CLI prints to a pipe).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an editor see; at run time, __getattr__ below
    from deployer.api.boards import Board, tensorboard
    from deployer.api.deploy import check, environments, plan, up
    from deployer.api.fleetwide import Executed, RunsFound, down, execute, pull, status
    from deployer.api.forward import Forward, tunnel
    from deployer.api.handle import LogLine, Result, Run, TaskState, attach
    from deployer.api.inventories import InventoryLike
    from deployer.api.logs import read_logs
    from deployer.api.profiles import Profiled, profile
    from deployer.api.views import View, terminal_view
    from deployer.config.plan import Plan, Task
    from deployer.core.errors import (
        ExitStatus,
        HostError,
        HostsFailed,
        Interrupted,
        InventoryError,
        JobFailed,
        LocalError,
        NetworkBlocked,
        TfdeployError,
        UsageError,
    )
    from deployer.results.pull import PullResult
    from deployer.watch.board import TaskRow
    from deployer.watch.view import PlainView

# Each name's module, imported at the name's first use: `up` needs the whole deploy machinery
# (SSH, the push, the live view: ~100 ms of imports), while `tfdeploy pull` and a notebook's
# `from deployer.api import PullResult` need none of it. Every `deployer.api.*` import goes
# through this package, so an eager one here would make each command pay for all of them.
_HOMES = {
    "Board": "deployer.api.boards",
    "tensorboard": "deployer.api.boards",
    "check": "deployer.api.deploy",
    "environments": "deployer.api.deploy",
    "plan": "deployer.api.deploy",
    "up": "deployer.api.deploy",
    "Executed": "deployer.api.fleetwide",
    "RunsFound": "deployer.api.fleetwide",
    "down": "deployer.api.fleetwide",
    "execute": "deployer.api.fleetwide",
    "pull": "deployer.api.fleetwide",
    "status": "deployer.api.fleetwide",
    "Forward": "deployer.api.forward",
    "tunnel": "deployer.api.forward",
    "LogLine": "deployer.api.handle",
    "Result": "deployer.api.handle",
    "Run": "deployer.api.handle",
    "TaskState": "deployer.api.handle",
    "attach": "deployer.api.handle",
    "InventoryLike": "deployer.api.inventories",
    "read_logs": "deployer.api.logs",
    "Profiled": "deployer.api.profiles",
    "profile": "deployer.api.profiles",
    "View": "deployer.api.views",
    "terminal_view": "deployer.api.views",
    "Plan": "deployer.config.plan",
    "Task": "deployer.config.plan",
    "ExitStatus": "deployer.core.errors",
    "HostError": "deployer.core.errors",
    "HostsFailed": "deployer.core.errors",
    "Interrupted": "deployer.core.errors",
    "InventoryError": "deployer.core.errors",
    "JobFailed": "deployer.core.errors",
    "LocalError": "deployer.core.errors",
    "NetworkBlocked": "deployer.core.errors",
    "TfdeployError": "deployer.core.errors",
    "UsageError": "deployer.core.errors",
    "PullResult": "deployer.results.pull",
    "TaskRow": "deployer.watch.board",
    "PlainView": "deployer.watch.view",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next use is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "Board",
    "Executed",
    "ExitStatus",
    "Forward",
    "HostError",
    "HostsFailed",
    "Interrupted",
    "InventoryError",
    "InventoryLike",
    "JobFailed",
    "LocalError",
    "LogLine",
    "NetworkBlocked",
    "PlainView",
    "Plan",
    "Profiled",
    "PullResult",
    "Result",
    "Run",
    "RunsFound",
    "Task",
    "TaskRow",
    "TaskState",
    "TfdeployError",
    "UsageError",
    "View",
    "attach",
    "check",
    "down",
    "environments",
    "execute",
    "plan",
    "profile",
    "pull",
    "read_logs",
    "status",
    "tensorboard",
    "terminal_view",
    "tunnel",
    "up",
]
