"""[job.tensorboard] reachable from this machine while `up` watches: the local end of the
sidecar's port (results/tunnel.py forwards it), opened when the job starts and closed when
`up` ends, whatever ended it.
"""

from __future__ import annotations

from deployer.hosts.fleet import Fleet
from deployer.results.tunnel import Tunnel, forward_sidecar
from deployer.watch.runstate import RunState
from deployer.watch.view import Display


class Dashboard:
    """The one tunnel of an `up` to its tensorboard; a restart-job attempt keeps an open one."""

    def __init__(self, fleet: Fleet, run: RunState, view: Display, *, detached: bool) -> None:
        self.fleet, self.run, self.view, self.detached = fleet, run, view, detached
        self.tunnel: Tunnel | None = None

    def forward(self) -> None:
        """A local port forwarded to the sidecar (a detached run: the command that does it
        later), and where to find it said."""
        if self.tunnel is None:
            self.tunnel, said = forward_sidecar(
                self.fleet, self.run.plan, self.run.run_id, detached=self.detached
            )
            if said:
                self.view.step(said)

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()
