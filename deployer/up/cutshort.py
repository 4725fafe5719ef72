"""An `up` cut short: by a failure (the job's, a host's, tfdeploy's own) or by Ctrl-C or a signal
(SIGTERM, SIGHUP: errors.Terminated). Either way every task that was started is stopped before
`up` returns, the machines tfdeploy launched keep their idle stop, and job.artifacts still come
home; what was interrupted says by which signal.
"""

from __future__ import annotations

import contextlib
import signal

from deployer.core.errors import Interrupted
from deployer.hosts.fleet import Fleet
from deployer.up.artifacts import ArtifactsPull
from deployer.up.recovery import Recovery
from deployer.up.teardown import Teardown
from deployer.watch.poller import Poller
from deployer.watch.view import SteadyView


class CutShort:
    """The stop of a run whose `up` did not end as planned; the view is steady from the first
    step (a closed terminal loses words, not the stop)."""

    def __init__(
        self,
        run_id: str,
        fleet: Fleet,
        poller: Poller,
        view: SteadyView,
        *,
        teardown: Teardown,
        recovery: Recovery,
        pull: ArtifactsPull,
    ) -> None:
        self.run_id, self.fleet, self.poller, self.view = run_id, fleet, poller, view
        self.teardown, self.recovery, self.pull = teardown, recovery, pull

    def after_failure(self) -> None:
        """A failure: the run stopped, then the artifacts a failed job left (its checkpoints are
        what debugging needs); the failure is raised after, and `up` prints it."""
        self.view.steady = True
        self.teardown()
        self.recovery.arm_idle_stop_anyway()
        self.pull.after_failure()

    def after_interrupt(self, signum: int) -> Interrupted:
        """Teardown after Ctrl-C or a signal; the error to raise, naming the signal."""
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        self.view.steady = True  # a terminal closed (SIGHUP) fails each print: words only
        if not self.pull.tried:  # else every task had stopped before the pull
            self.fleet.interrupt()  # abandon calls in flight (a push): the stop goes first
            self.poller.abandon()
            self.view.step(
                f"interrupted{by}: stopping every task that was started "
                "(Ctrl-C again to kill at once)"
            )
            self.teardown()
            self.recovery.arm_idle_stop_anyway()
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C skips the pull
                self.pull()
        return Interrupted(f"interrupted{by}; run {self.run_id} was stopped", signum=signum)
