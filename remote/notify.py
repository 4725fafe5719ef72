"""A run's notifications ([job.notify]): per event (started, recovered, failed, finished), one
JSON document POSTed to the job's webhook and one run of its command, by whoever holds the run:
its keeper (keeper.py, on the keeper's host) or `up` (deployer/up/notifying.py, on the user's
machine). One module for both, so both send the same document.

A notification never changes the run: they are sent in order by one thread of their own, each
with a timeout, and a failure is handed to `said` (the keeper's record, `up`'s view), never
raised. The webhook's
URL may carry a token (Slack's and most others' do): no message names more than its host.
Stdlib only, like every module of remote/.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

EVENTS = ("started", "recovered", "failed", "finished")
WEBHOOK_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 30.0


def document(event: str, run_id: str, job: str, by: str, **fields: Any) -> dict[str, Any]:
    """What the webhook receives: the event, the run, who sent it (keeper or up), when, and
    the event's own fields (outcome, why, attempt)."""
    return {"event": event, "run_id": run_id, "job": job, "by": by, "time": time.time(), **fields}


class Notifier:
    """Sends a run's events as its [job.notify] asks (`config`: webhook, command, events)."""

    def __init__(self, config: dict[str, Any] | None, said: Callable[[str], None]) -> None:
        self.config = config or {}
        self.said = said
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def wanted(self, event: str) -> bool:
        return bool(self.config) and event in self.config.get("events", EVENTS)

    def fire(self, doc: dict[str, Any]) -> None:
        """Queued for the sender: a receiver hears the events in the order they happened."""
        if not self.wanted(str(doc.get("event"))):
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._sender, daemon=True)
            self.thread.start()
        self.queue.put(doc)

    def wait(self, timeout: float = WEBHOOK_TIMEOUT_S + COMMAND_TIMEOUT_S) -> None:
        """Until what was fired is sent (a process about to end), at most `timeout`."""
        if self.thread is None:
            return
        self.queue.put(None)
        self.thread.join(timeout)

    def _sender(self) -> None:
        while True:
            doc = self.queue.get()
            if doc is None:
                return
            self._send(doc)

    def _send(self, doc: dict[str, Any]) -> None:
        webhook, command = self.config.get("webhook"), self.config.get("command")
        if isinstance(webhook, str):
            problem = post(webhook, doc)
            if problem:
                self.said(f"notification {doc['event']}: {problem}")
        if isinstance(command, str):
            problem = run_command(command, doc)
            if problem:
                self.said(f"notification {doc['event']}: {problem}")


def post(url: str, doc: dict[str, Any]) -> str | None:
    """POSTs `doc`; None when the receiver answered 2xx, else what went wrong (its host only)."""
    host = urllib.parse.urlsplit(url).hostname or "?"
    request = urllib.request.Request(
        url,
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "tfdeploy"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError, http.client.HTTPException) as exc:  # garbage for an answer too
        return f"the webhook at {host} could not be reached ({type(exc).__name__})"
    if not 200 <= status < 300:
        return f"the webhook at {host} answered HTTP {status}"
    return None


def run_command(command: str, doc: dict[str, Any]) -> str | None:
    """Runs the command with the event in its environment; None when it exited 0."""
    env = dict(os.environ)
    for key in ("event", "run_id", "job", "outcome", "why", "attempt"):
        env["TFDEPLOY_" + key.upper()] = str(doc.get(key, ""))
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"the command ran past {COMMAND_TIMEOUT_S:g} s and was killed"
    except OSError as exc:
        return f"the command could not start ({exc.strerror})"
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"the command exited {done.returncode}: {last[0][:200]}"
    return None
