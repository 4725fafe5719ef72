"""[job.notify] from `up`: the events of a run that `up` holds (remote/notify.py sends them).

`up` tells `started` for every run (it is there when the tasks start). After that, whoever holds
the run's policy tells the rest: a kept run's keeper, beside the hosts, tells `recovered`,
`failed` and `finished` (this machine may be asleep by then), so `up` tells them only for a run
it holds itself, and `finished` (stopped) when it stops a run (Ctrl-C, SIGTERM), whose keeper
the stop ended first. The webhook's URL is never shown: it may hold a token.
"""

from __future__ import annotations

from typing import Any

from deployer.config.model import Notify
from deployer.results.state import controller_name
from remote import notify


def notify_config(config: Notify | None) -> dict[str, Any] | None:
    """[job.notify] as remote/notify.py and the keeper's plan read it."""
    if config is None:
        return None
    return {"webhook": config.webhook, "command": config.command, "events": list(config.events)}


class RunNotifier:
    """Tells a run's events from `up`; `said` gets a notification that failed (never the URL)."""

    def __init__(self, config: Notify | None, run_id: str, job: str, said: Any) -> None:
        self.run_id, self.job = run_id, job
        self.sender = notify.Notifier(notify_config(config), said)
        self.sent: set[str] = set()

    def tell(self, event: str, *, outcome: str, why: str = "", attempt: int = 0) -> None:
        doc = notify.document(event, self.run_id, self.job, f"up on {controller_name()}")
        self.sender.fire({**doc, "outcome": outcome, "why": why, "attempt": attempt})
        self.sent.add(event)

    def tell_end(self, event: str, *, outcome: str, why: str, attempt: int, held: bool) -> None:
        """The run's end, when this `up` ends it (`held`): not a run it let go (detached, or
        handed to its keeper, which then tells its own end), but a run this `up` stops (Ctrl-C,
        a failure it judged, a kept run's keeper ended by its teardown). A run that never
        started has no end to tell."""
        if held and "started" in self.sent:
            self.tell(event, outcome=outcome, why=why, attempt=attempt)

    def close(self) -> None:
        """Before `up` exits: what it told is sent, or given up after its timeouts."""
        self.sender.wait()
