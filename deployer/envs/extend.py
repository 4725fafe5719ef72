"""A set that only adds requirements to one already resolved keeps that one's pins.

Adding one small package (`tqdm`) to a TensorFlow set made pip resolve the whole set again:
3.4 s here for 38 wheels it already had, every time, and the warm `up` waited for it (issue 58:
the "+1 requirement" `up` within 3 s of an unchanged one). The added lines alone, resolved
against the earlier set's versions as constraints and its wheels as a find-links folder, take
pip under a second and ask the index about the new projects only.

What that decides: the earlier set's versions stay. A full resolution could pick a newer release
of a package the set already had; this one does not, which is what a user who adds a line
expects (nothing else changes under the job). When the added lines cannot live with those pins
(they need a newer numpy), pip says so and the caller resolves the whole set as before.

Only plain requirement lines count as added. An earlier set qualifies when it was resolved for
the same platform, its lines are all among the new ones, and neither names a constraints file or
a local path: their contents are in the environment's identity (spec.py) but not in its lines,
so equal lines would not prove an equal set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deployer.envs import wheelhouse
from deployer.envs.wheelhouse import Wheelhouse

# A line whose meaning is more than its text: a constraints file, a local path or archive, a URL.
_CONTENT_BEYOND_TEXT = re.compile(r"^(-c|--constraint)\b|^[.~/]|^file:|\s@\s|://|\.(whl|zip|gz)\b")


@dataclass(frozen=True)
class Extension:
    """`base`, the resolved set the new one extends, and the lines the new one adds to it."""

    base: Wheelhouse
    added: tuple[str, ...]

    def requirements(self, lines: Sequence[str], pins: Path) -> str:
        """What pip resolves: every option line (index, find-links), the added requirements,
        and the base's versions as constraints."""
        options = [line for line in lines if line.startswith("-")]
        return "".join(f"{line}\n" for line in (*options, *self.added, f"-c {pins}"))

    def pins(self) -> str:
        """`name==version` of every wheel of the base (a constraints file: no hashes)."""
        return "".join(f"{w.name}=={w.version}\n" for w in self.base.wheels)


def find(root: Path, lines: Sequence[str], platform: str) -> Extension | None:
    """The newest resolved set in cache `root` that `lines` (as pip reads them for the host)
    only add requirements to, with the fewest lines added; None when there is none."""
    if not lines or any(_CONTENT_BEYOND_TEXT.search(line) for line in lines):
        return None
    wanted = set(lines)
    best: Extension | None = None
    for entry in wheelhouse.newest(root)[: wheelhouse.SEED_ENTRIES]:
        house = wheelhouse.load(entry, entry.name)
        if house is None or house.platform != platform or not house.lines:
            continue
        if not set(house.lines) <= wanted:
            continue
        added = tuple(line for line in lines if line not in house.lines)
        if not added or any(line.startswith("-") for line in added):
            continue
        if best is None or len(added) < len(best.added):
            best = Extension(house, added)
    return best


def consistent(house: Wheelhouse, base: Wheelhouse) -> bool:
    """The extended set holds every wheel of the base, as the base had it (the same bytes),
    and one version of each project."""
    mine = {w.file: w.sha256 for w in house.wheels}
    if any(mine.get(w.file) != w.sha256 for w in base.wheels):
        return False
    projects = [wheelhouse.canonical(w.name) for w in house.wheels]
    return len(projects) == len(set(projects))
