"""Where this controller keeps what it remembers between commands: run records, log archives,
the code directory's hashes. Private to the user; losing it costs time, never correctness."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    override = os.environ.get("TFDEPLOY_STATE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tfdeploy"
