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

from deployer.api.deploy import check, plan, up
from deployer.api.handle import LogLine, Result, Run, TaskState, attach
from deployer.api.inventories import InventoryLike
from deployer.api.views import View
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

__all__ = [
    "ExitStatus",
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
    "PullResult",
    "Result",
    "Run",
    "Task",
    "TaskRow",
    "TaskState",
    "TfdeployError",
    "UsageError",
    "View",
    "attach",
    "check",
    "plan",
    "up",
]
