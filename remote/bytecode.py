"""A new environment starts with the bytecode its host already compiled for the same modules.

Environments are built without compiling bytecode (installers.py says why): a task compiles what
it imports at its first step, into the venv's `__pycache__`. A second environment that differs
from the first by one package (a requirement added) then compiles TensorFlow's imports all over
again at its first step: tens of seconds of CPU per host for modules it already has compiled.

uv hard-links every environment's files from the host's cache, so a module of the new
environment that comes from the same wheel is the same file (inode) as in the old one. Python
accepts a `.pyc` whose header matches its source's mtime and size, and fixes the code's file name
to the module's own path when it loads it, so the old environment's `.pyc` is valid as it is: it
is hard-linked next to the new environment's module. Python replaces a `.pyc` by writing a new
file and renaming it, never in place, so neither environment can change the other's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

PYCACHE = "__pycache__"


def seed(venv: Path, version: str, siblings: list[Path]) -> int:
    """Links into `venv` the `.pyc` files of `siblings` (built environments on this host) whose
    module is the same file in `venv`; returns how many were linked. `version`: the venv's
    Python ("3.11.2"), whose cache tag the files must carry."""
    ours = site_packages(venv, version)
    if ours is None:
        return 0
    tag = "cpython-" + "".join(version.split(".")[:2])
    linked = 0
    for other in siblings:
        theirs = site_packages(other, version)
        if theirs is None:
            continue
        for pyc, rel in _compiled(theirs, tag):
            linked += _link(pyc, theirs, ours, rel)
    return linked


def site_packages(venv: Path, version: str) -> Path | None:
    minor = ".".join(version.split(".")[:2])
    path = venv / "lib" / f"python{minor}" / "site-packages"
    return path if path.is_dir() else None


def _compiled(root: Path, tag: str) -> Iterator[tuple[Path, Path]]:
    """Every `.pyc` of cache tag `tag` under `root`, with its module's directory relative to it."""
    for folder, dirs, files in os.walk(str(root)):
        if os.path.basename(folder) != PYCACHE:
            continue
        dirs[:] = []
        rel = Path(folder).parent.relative_to(root)
        for name in files:
            if name.endswith(".pyc") and f".{tag}." in name:
                yield Path(folder) / name, rel


def _link(pyc: Path, theirs: Path, ours: Path, rel: Path) -> int:
    """1 when `pyc` was linked into `ours`; 0 when its module is not the same file there (another
    version of the package, or none) or `ours` has its own `.pyc` already."""
    module = pyc.name.split(".", 1)[0] + ".py"
    target = ours / rel / PYCACHE / pyc.name
    try:
        mine, old = os.stat(str(ours / rel / module)), os.stat(str(theirs / rel / module))
        if (mine.st_ino, mine.st_dev) != (old.st_ino, old.st_dev) or target.exists():
            return 0
        target.parent.mkdir(mode=0o755, exist_ok=True)
        os.link(str(pyc), str(target))
    except OSError:  # gone meanwhile, another file system, no room: compiled at import instead
        return 0
    return 1
