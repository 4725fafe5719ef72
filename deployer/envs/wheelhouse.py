"""A resolved environment on this machine: its wheels, and the manifest that names them.

Layout of one cache entry (`<cache>/<environment hash>/`):

- `wheels/*.whl`: every wheel the hosts install, dependencies included;
- `pinned.txt`: `name==version --hash=sha256:...` per wheel, what a host installs with
  `pip install --no-index --find-links wheels -r pinned.txt` (pip's hash-checking mode: a wheel
  changed on the way or on disk is refused by the host's own pip);
- `manifest.json`: the wheels with their sha256 and size (what the content store sends), the
  target platform, and the requirements text the entry was resolved from.

An entry appears whole (written under a temporary name, then renamed) or not at all, so a
resolution interrupted half-way is never reused. The manifest is read back with every wheel's
size checked: a wheel deleted or truncated by hand makes the entry stale, not wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from deployer.core.digest import sha256_file

VERSION = 1
MANIFEST = "manifest.json"
PINNED = "pinned.txt"
WHEELS = "wheels"
# name-version(-build)?-python-abi-platform.whl (PEP 427); names are normalized with "_".
_WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


@dataclass(frozen=True)
class Wheel:
    file: str
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return _parts(self.file)["name"]

    @property
    def version(self) -> str:
        return _parts(self.file)["version"]

    @property
    def pure(self) -> bool:
        """Runs on every platform: `py3-none-any` and the like."""
        return is_pure(self.file)


@dataclass(frozen=True)
class Wheelhouse:
    """One resolved environment in the cache. `key` is the environment hash."""

    path: Path
    key: str
    platform: str
    wheels: tuple[Wheel, ...]
    requirements: str

    @property
    def size(self) -> int:
        return sum(w.size for w in self.wheels)

    @property
    def wheel_dir(self) -> Path:
        return self.path / WHEELS

    @property
    def pinned(self) -> Path:
        return self.path / PINNED


def is_pure(filename: str) -> bool:
    parts = _parts(filename)
    return parts["abi"] == "none" and parts["plat"] == "any"


def _parts(filename: str) -> dict[str, str]:
    match = _WHEEL_NAME.match(filename)
    if match is None:
        raise ValueError(f"not a wheel file name: {filename}")
    return match.groupdict()


def write(path: Path, key: str, platform: str, requirements: str) -> Wheelhouse:
    """The manifest and pinned list of the wheels now in `path/wheels` (an entry being built)."""
    wheels = tuple(
        Wheel(w.name, sha256_file(w), w.stat().st_size)
        for w in sorted((path / WHEELS).glob("*.whl"))
    )
    pins = "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels)
    (path / PINNED).write_text(pins)
    doc = {
        "version": VERSION,
        "key": key,
        "platform": platform,
        "wheels": [{"file": w.file, "sha256": w.sha256, "size": w.size} for w in wheels],
        "requirements": requirements,
    }
    (path / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return Wheelhouse(path, key, platform, wheels, requirements)


def load(path: Path, key: str) -> Wheelhouse | None:
    """The entry at `path` if it is whole and for `key`; None means resolve again."""
    try:
        doc = json.loads((path / MANIFEST).read_text())
        if doc.get("version") != VERSION or doc.get("key") != key:
            return None
        wheels = tuple(Wheel(w["file"], w["sha256"], int(w["size"])) for w in doc["wheels"])
        for w in wheels:
            if (path / WHEELS / w.file).stat().st_size != w.size:
                return None
        return Wheelhouse(path, key, str(doc["platform"]), wheels, str(doc["requirements"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
