"""EC2 spot interruption notices, read from the instance metadata service (IMDSv2).

AWS announces the end of a spot instance about two minutes ahead, only through IMDS. A task
that gets SIGTERM at once can save a checkpoint; one that learns nothing dies mid-step, and the
job loses everything since its last checkpoint. The supervisor of a task whose spec has a
`spot` item polls here (see supervisor.py) and stops the task before the instance goes.

A broken or absent IMDS must never hurt the task: every failure is "no notice", retried at the
next poll. The session token is a credential for the metadata service: it is kept in memory
only and never written or logged.

Stdlib only and no sibling imports, so the control side's tests can import it as `remote.spot`.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
import urllib.parse
from typing import Any, NamedTuple

DEFAULT_URL = "http://169.254.169.254"
DEFAULT_INTERVAL = 5.0  # seconds between polls; AWS suggests every 5 s
DEFAULT_MARGIN = 15.0  # seconds before the announced time when the task gets SIGKILL
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL = 21600  # seconds (IMDSv2's maximum); the token is renewed a minute before
TIMEOUT = 1.0  # per request: IMDS answers in milliseconds, an unreachable one must not stall
MAX_BODY = 65536
ACTIONS = ("terminate", "stop", "hibernate")
UNREADABLE_TIME_S = 120.0  # AWS's documented warning, for a notice whose time cannot be read
SPEC_KEYS = ("url", "interval", "margin")


class Notice(NamedTuple):
    """An interruption notice: `action` and `time` as IMDS gave them, `at` in Unix seconds."""

    action: str
    time: str
    at: float


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an IMDS base URL (None when it can): plain http, host, no path.

    Checked when the task starts, so a typo is the start op's error, not a silent poller.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a port that is not a number (or out of range) raises here
    except ValueError as exc:
        return str(exc)
    if port == 0:
        return "port 0 is not a port to connect to"
    if parts.scheme != "http" or not parts.hostname:
        return "it must be http://HOST or http://HOST:PORT (IMDS speaks plain HTTP)"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return "it must be only http://HOST or http://HOST:PORT"
    return None


def parse_time(text: str) -> float | None:
    """'2026-11-23T14:50:00Z' -> Unix seconds; None for anything else."""
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)  # IMDS times are UTC
    return when.timestamp()


def parse_notice(body: bytes, now: float) -> Notice | None:
    """The notice in an instance-action body, or None when the body is not one."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("action") not in ACTIONS:
        return None
    raw_time = data.get("time")
    text = raw_time if isinstance(raw_time, str) else ""
    at = parse_time(text)
    # An announced end we cannot read is still an end: better a checkpoint than none.
    return Notice(data["action"], text, now + UNREADABLE_TIME_S if at is None else at)


class Client:
    """IMDSv2 for one base URL: a session token (cached, renewed), then the instance action."""

    def __init__(self, url: str, timeout: float = TIMEOUT) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.timeout = timeout
        self._token: str | None = None
        self._token_until = 0.0

    def check(self) -> Notice | None:
        """One poll; any failure (network, timeout, garbage, refusal) is None."""
        try:
            return self._check()
        except Exception:  # a broken IMDS must never reach the task
            return None

    def _check(self) -> Notice | None:
        for _ in range(2):  # a 401 means the token lapsed or was revoked: get one and retry
            token = self._session_token()
            if token is None:
                return None
            status, body = self._call("GET", ACTION_PATH, {"X-aws-ec2-metadata-token": token})
            if status == 401:
                self._token = None
                continue
            return parse_notice(body, time.time()) if status == 200 else None
        return None

    def _session_token(self) -> str | None:
        if self._token is not None and time.monotonic() < self._token_until:
            return self._token
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}
        status, body = self._call("PUT", TOKEN_PATH, ttl)
        token = body.decode("ascii", "replace").strip()
        if status != 200 or not token or not token.isprintable():
            self._token = None
            return None
        self._token, self._token_until = token, time.monotonic() + TOKEN_TTL - 60
        return token

    def _call(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """http.client, not urllib.request: no proxy from the environment, no redirects."""
        import http.client  # ~25 ms of imports that only supervisors of spot tasks pay

        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(MAX_BODY)
        finally:
            conn.close()


class Watch:
    """Polls in a daemon thread until a notice comes or it is stopped; the supervisor's tick
    loop reads `notice`, so its stop and lease checks never wait for the network."""

    def __init__(self, url: str, interval: float) -> None:
        self.client = Client(url)
        self.interval = max(interval, 0.05)
        self.notice: Notice | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self.client.check()
            if found is not None:
                self.notice = found  # one notice is all there is: polling ends here
                return
            self._stop.wait(self.interval)
