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

Entries share their wheels: `<cache>/.wheels/<sha256>` holds each wheel once, and every entry's
`wheels/<file>` is a hard link to it, so three variants of a TensorFlow set cost about one set
of disk. The store also seeds the next resolution (resolve.py): the wheels it holds are linked
into the new entry before pip runs, so pip fetches only the wheels it has not seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from deployer.core.digest import sha256_file

VERSION = 1
MANIFEST = "manifest.json"
PINNED = "pinned.txt"
WHEELS = "wheels"
STORE = ".wheels"  # under the cache root: one file per wheel, named by its sha256
SEED_ENTRIES = 32  # the newest entries whose wheels seed a resolution
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
    lines: tuple[str, ...] = ()  # as pip read them for the platform (extend.py compares them)

    @property
    def size(self) -> int:
        return sum(w.size for w in self.wheels)

    @property
    def wheel_dir(self) -> Path:
        return self.path / WHEELS

    @property
    def pinned(self) -> Path:
        return self.path / PINNED


def canonical(name: str) -> str:
    """A project's name as PEP 503 compares them: runs of -_. are one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_pure(filename: str) -> bool:
    parts = _parts(filename)
    return parts["abi"] == "none" and parts["plat"] == "any"


def _parts(filename: str) -> dict[str, str]:
    match = _WHEEL_NAME.match(filename)
    if match is None:
        raise ValueError(f"not a wheel file name: {filename}")
    return match.groupdict()


def write(
    path: Path, key: str, platform: str, requirements: str, lines: tuple[str, ...] = ()
) -> Wheelhouse:
    """The manifest and pinned list of the wheels now in `path/wheels` (an entry being built).
    `lines`: the requirements as pip read them for the platform."""
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
        "lines": list(lines),
    }
    (path / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return Wheelhouse(path, key, platform, wheels, requirements, lines)


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
        said = doc.get("lines", [])
        lines = tuple(x for x in said if isinstance(x, str)) if isinstance(said, list) else ()
        return Wheelhouse(path, key, str(doc["platform"]), wheels, str(doc["requirements"]), lines)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_of(root: Path) -> Path:
    return root / STORE


def share(house: Wheelhouse, store: Path) -> None:
    """Every wheel of `house` (an entry being built, on the cache's file system) made one file
    with the store's: a wheel new to the store is linked into it; one the store has is linked
    from it. Where hard links cannot be made (another file system), each keeps its own copy."""
    with contextlib.suppress(OSError):
        store.mkdir(parents=True, exist_ok=True)
    for w in house.wheels:
        mine, kept = house.wheel_dir / w.file, store / w.sha256
        with contextlib.suppress(OSError):
            if kept.exists() and os.path.samefile(mine, kept):
                continue
            # The bytes in the entry were hashed just now (write): they become the store's, so a
            # store file damaged since it was stored is never linked into a new entry.
            part = store / f".{w.sha256}.{os.getpid()}.partial"
            os.link(mine, part)
            os.replace(part, kept)


def seed(root: Path, into: Path, platform: str) -> dict[str, str]:
    """Links into `into` the wheels of the newest entries that fit `platform` (theirs, and
    every pure wheel), by file name, from the store (or the entry itself, for an entry written
    before the store): pip takes a file already in its download folder as downloaded ("File
    was already downloaded"), so only new wheels are fetched. Returns {file name: sha256} of
    what was linked (the caller checks those bytes); a name two wheels share is left out."""
    store = store_of(root)
    names: dict[str, tuple[str, Path]] = {}
    clashes: set[str] = set()
    for entry in newest(root)[:SEED_ENTRIES]:
        house = load(entry, entry.name)
        if house is None:
            continue
        for w in house.wheels:
            if house.platform != platform and not w.pure:
                continue
            kept = store / w.sha256
            source = kept if kept.exists() else house.wheel_dir / w.file
            if names.setdefault(w.file, (w.sha256, source))[0] != w.sha256:
                clashes.add(w.file)
    linked = {}
    into.mkdir(parents=True, exist_ok=True)
    for name, (sha, source) in names.items():
        if name in clashes:
            continue
        with contextlib.suppress(OSError):
            os.link(source, into / name)
            linked[name] = sha
    return linked


def forget(root: Path, sha256: str) -> None:
    """A stored wheel found damaged leaves the store: no later resolution is seeded with it."""
    with contextlib.suppress(OSError):
        (store_of(root) / sha256).unlink()


def newest(root: Path) -> list[Path]:
    """The cache's entries, the most recently written first."""
    try:
        found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    stamped = []
    for entry in found:
        with contextlib.suppress(OSError):
            stamped.append(((entry / MANIFEST).stat().st_mtime, entry))
    return [entry for _, entry in sorted(stamped, reverse=True)]


def disk_use(root: Path) -> tuple[int, int]:
    """(bytes on disk, entries) of the cache at `root`: each file once, however many entries
    link it (what `tfdeploy prune --local` can free)."""
    seen: dict[tuple[int, int], int] = {}
    for top, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, name))
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values()), len(newest(root))
