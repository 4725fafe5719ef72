"""What this machine last learnt of each host's platform, so `plan` (which touches no host) can
say which environment a host will get and whether its wheels are already resolved here.

`up` and `check` remember each host's facts as preflight reports them; a record is a
convenience, so one that cannot be written or read is as if there were none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from deployer.core.statedir import state_dir
from deployer.envs.platform import HostPlatform

FILE = "hosts.json"  # under the resolver's cache folder: {host key: facts}


def _path() -> Path:
    return state_dir() / "envs" / FILE


def host_key(address: str, python: str) -> str:
    """A host's platform is its interpreter's: the same address with another `python` differs."""
    return f"{address}|{python}"


def remember(facts: dict[str, dict[str, str | None]]) -> None:
    """Adds {host key: {python, machine, glibc}} to the record (written whole, then renamed)."""
    path = _path()
    try:
        known = _read(path)
        known.update(facts)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{FILE}.{os.getpid()}")
        part.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        part.replace(path)
    except OSError:
        pass  # a convenience: the next `up` learns the facts again


def recall(key: str) -> HostPlatform | None:
    """The platform of the host `key` as last seen here, or None."""
    facts = _read(_path()).get(key)
    if not isinstance(facts, dict):
        return None
    try:
        glibc = facts.get("glibc")
        return HostPlatform.of(
            str(facts["python"]), str(facts["machine"]), str(glibc) if glibc else None
        )
    except (KeyError, ValueError, IndexError):
        return None


def _read(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
