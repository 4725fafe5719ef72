"""Whether the controller that sent the request being handled is still there.

A long op (collect hashing gigabytes, walking a big tree) would otherwise run to its end after
the controller left (Ctrl-C of a pull, a dropped connection): nobody reads its reply, and a
pattern that names too much keeps a host's CPU and memory busy until someone kills the agent.
Such ops call `check()` as they go; it raises once the caller is gone, and the agent ends.

The caller is gone when the reader of stdout went away (sshd or the local parent closed its
end of the pipe: POLLERR, or POLLHUP for a socket) or, in a session (`agent.py serve`), when
stdin ended: the controller sends nothing more while it waits for a reply, so an end of stdin
mid-request means it closed the session. A one-shot call's stdin ends after its request, so
only the first test applies there.
"""

from __future__ import annotations

import io
import select
import sys
import time

import params

EVERY_S = 0.2  # at most this often: callers check per directory entry and per MiB hashed

serving = False  # set by agent.serve: stdin stays open between requests
_last = 0.0


def gone() -> bool:
    """True once the caller left; looks at most every EVERY_S seconds (False in between)."""
    global _last
    now = time.monotonic()
    if now - _last < EVERY_S:
        return False
    _last = now
    return _reader_gone() or (serving and _stdin_ended())


def check() -> None:
    if gone():
        raise params.CallerGone("the controller went away; the request was abandoned")


def _reader_gone() -> bool:
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are always reported
        events = poller.poll(0)
    except (OSError, ValueError):  # no stdout at all: nobody can read a reply
        return True
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def _stdin_ended() -> bool:
    try:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], 0)
        if not ready:
            return False
        # Readable: the end, or a next request sent early. peek() keeps what it reads for the
        # serve loop and returns b"" only at the end.
        stdin = sys.stdin.buffer
        assert isinstance(stdin, io.BufferedReader)  # Python's own stdin: always buffered
        return stdin.peek(1) == b""
    except (OSError, ValueError):
        return True
