"""When a host that does not answer stops being slow and becomes lost.

Pure bookkeeping on a clock the caller passes in: the poller records each answer and each failed
or unanswered poll, and this module says which are outages worth a message and which host is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deployer.core.errors import HostError, JobFailed

# A host is declared lost when no poll has succeeded for this long. Shorter outages (a reset
# connection that is re-opened, a slow reply under load) are retried every poll tick. A crashed
# host refuses connections at once, a cut link leaves its poll unanswered; either way the window
# runs from the last good contact, so both are seen within HOST_LOSS_S + a tick (< 10 s), never
# after the kernel's ~15-minute retransmission timeout.
HOST_LOSS_S = 6.0


@dataclass(frozen=True)
class Loss:
    host: str
    since: float  # seconds without contact
    cause: str

    def error(self, tasks: Sequence[str], *, lease: float, status_command: str) -> JobFailed:
        """The job's failure: which host, for how long, and that its tasks end with the lease."""
        return JobFailed(
            f"host {self.host} was lost: no contact for {self.since:.1f} s ({self.cause}); "
            f"its tasks {', '.join(tasks)} stop by themselves when the controller's lease "
            f"lapses ({lease:g} s)",
            hint=f"the other hosts were stopped; check the host and its network, then "
            f"`{status_command}`",
        )


@dataclass(frozen=True)
class Verdict:
    """What one tick's failures mean: new outages to report, and the first lost host, if any."""

    outages: tuple[HostError, ...] = ()
    loss: Loss | None = None


class HostContact:
    """Tells a slow or briefly unreachable host from a lost one.

    A failed or unanswered poll is an outage until HOST_LOSS_S pass without contact; then the
    host is lost. Each retry reconnects if the connection died, so a reset connection costs one
    tick and the logs go on from the same byte offsets.
    """

    def __init__(self, loss_after: float = HOST_LOSS_S) -> None:
        self.loss_after = loss_after
        self.last: dict[str, float] = {}  # host -> clock of its last successful call
        self.lost: dict[str, str] = {}  # host -> why it was declared lost
        self.outages: set[str] = set()  # hosts whose last poll failed, not yet lost

    def reached(self, host: str, now: float) -> bool:
        """Records contact; True when it ends an outage (worth telling the user)."""
        self.last[host] = now
        if host in self.outages:
            self.outages.discard(host)
            return True
        return False

    def forget(self, host: str) -> None:
        self.last.pop(host, None)
        self.lost.pop(host, None)
        self.outages.discard(host)

    def judge(self, failures: Sequence[HostError], silent: Sequence[str], now: float) -> Verdict:
        """Failed polls and polls still unanswered at `now`: new outages, and the first loss."""
        waiting = [HostError(h, "its poll is still unanswered") for h in silent]
        outages: list[HostError] = []
        for failure in [*failures, *waiting]:
            since = now - self.last.setdefault(failure.host, now)
            if since >= self.loss_after:
                self.lost[failure.host] = failure.cause
                return Verdict(tuple(outages), Loss(failure.host, since, failure.cause))
            if failure in waiting:
                continue  # slow, not (yet) failed: no message
            if failure.host not in self.outages:
                self.outages.add(failure.host)
                outages.append(failure)
        return Verdict(tuple(outages))
