"""The installer that travels with an environment: uv's wheel for the host's platform.

uv installs a venv from a local wheelhouse several times faster than pip (the TensorFlow set:
40 s with pip, 7.3 s with uv and an empty cache, 0.65 s with a warm one: docs/bench/env.md),
but it is a native binary, so each host platform needs its own wheel. It is resolved here like
any requirement (`uv==UV_VERSION` through this machine's pip, its configuration holding) and
cached as an environment of its own, one per platform, so it is fetched once and then travels
through the same content store and fan-out as the job's wheels: sent once per host, kept.

Where no uv wheel exists for a host's platform (or this machine's index has none), the
environment is installed with pip there, and `up` says so: pip is the fallback, never an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from deployer.envs.platform import HostPlatform
from deployer.envs.resolve import ResolveError, cache_root, resolve
from deployer.envs.spec import EnvSpec, env_hash
from deployer.envs.wheelhouse import Wheelhouse

# The uv that builds the venvs on the hosts (its wheel holds a static binary, ~18 MB).
UV_VERSION = "0.13.9"
UV_REQUIREMENT = f"uv=={UV_VERSION}"
# A platform found to have no uv wheel is not asked again for this long (a failed resolution
# costs a round of pip; `--refresh-env` asks again at once).
NO_WHEEL_TTL_S = 24 * 3600.0


@dataclass(frozen=True)
class Choice:
    """The installer of one platform: uv with its wheelhouse, or pip and why."""

    installer: str  # "uv" or "pip"
    wheelhouse: Wheelhouse | None  # uv's wheel (None for pip)
    why: str = ""  # for pip where uv was asked: the reason, said once by `up`

    def said(self) -> str:
        """For `up`'s environment line: "installed with uv", or pip and why."""
        return f"installed with {self.installer}" + (f" ({self.why})" if self.why else "")


PIP = Choice("pip", None)  # by choice, or where uv cannot be asked (no wheels sent)


def spec() -> EnvSpec:
    """uv's requirement as an environment of its own (no files, no local paths)."""
    line = f"{UV_REQUIREMENT}\n"
    return EnvSpec(Path("/"), (UV_REQUIREMENT,), f"# installer\n{line}")


def choose(wanted: str, target: HostPlatform, *, refresh: bool = False) -> Choice:
    """uv for `target` when it is wanted and a wheel of it exists for the platform, else pip."""
    if wanted != "uv":
        return PIP
    if target.glibc is None:
        return Choice("pip", None, f"{UV_REQUIREMENT}: not resolved for {target.describe()}")
    known_none = cache_root() / f"{env_hash(spec(), target)}.no-uv"
    if not refresh and _fresh(known_none):
        return Choice("pip", None, known_none.read_text().strip())
    try:
        house = resolve(spec(), target, refresh=refresh, sdists=False)
    except ResolveError as exc:
        first = exc.message.splitlines()[0]
        why = first if first.startswith(UV_REQUIREMENT) else f"{UV_REQUIREMENT}: {first}"
        known_none.parent.mkdir(parents=True, exist_ok=True)
        known_none.write_text(why + "\n")
        return Choice("pip", None, why)
    known_none.unlink(missing_ok=True)
    return Choice("uv", house)


def _fresh(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < NO_WHEEL_TTL_S
    except OSError:
        return False
