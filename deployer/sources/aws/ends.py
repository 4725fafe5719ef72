"""When EC2 instances ended, as this machine saw it: `<state>/aws/ends.jsonl`.

A run's cost needs when each instance stopped costing, and EC2 lists a terminated instance for
about an hour only. So every end tfdeploy causes (`down`, `job-end`, a replaced host, a launch
that failed) or reads from EC2 (an idle stop, a spot interruption, seen while EC2 still lists
it) is kept here, one JSON line each: the cost of a run asked for next week still has it.

The file is this machine's, but it is read as untrusted (a full disk cuts a line, a person
edits one): a line that is not an instance id with a finite time is skipped, and only the last
READ_BYTES are read.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from deployer.core.statedir import state_dir

READ_BYTES = 4 * 1024 * 1024  # the newest ~60,000 ends
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}\Z")


def path() -> Path:
    return state_dir() / "aws" / "ends.jsonl"


def note(ended: Mapping[str, float]) -> None:
    """Keeps when each instance ended (appended: two tfdeploy commands may note at once, and a
    line shorter than PIPE_BUF is written whole). A disk that cannot take it costs only a
    later "cost unknown", so it is not an error."""
    lines = "".join(
        json.dumps({"id": i, "ended": t}) + "\n" for i, t in ended.items() if INSTANCE_ID.match(i)
    )
    if not lines:
        return
    with contextlib.suppress(OSError):
        path().parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(lines)


def known() -> dict[str, float]:
    """Each instance's end as kept (the earliest, if noted twice); {} when there is no file."""
    try:
        with path().open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - READ_BYTES))
            data = f.read(READ_BYTES)
    except OSError:
        return {}
    found: dict[str, float] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        entry = _entry(line)
        if entry is not None:
            found[entry[0]] = min(entry[1], found.get(entry[0], entry[1]))
    return found


def _entry(line: str) -> tuple[str, float] | None:
    if len(line) > 200:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    ident, ended = data.get("id"), data.get("ended")
    if not isinstance(ident, str) or not INSTANCE_ID.match(ident):
        return None
    if isinstance(ended, bool) or not isinstance(ended, int | float) or not math.isfinite(ended):
        return None
    return ident, float(ended)
