"""Many rows in a few lines: the rows that matter most, and the others counted by kind.

A table of 256 tasks fits no terminal, and the reader wants the few that need a look (failed,
restarted, silent) and how many of the rest are in which state. The live view and `status` both
fold their tables this way; what matters most is theirs to say (`rank`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from deployer.core.text import join_names

T = TypeVar("T")


@dataclass(frozen=True)
class Folded(Generic[T]):
    """The rows to show, most important first, and how many of the others are of which kind."""

    shown: list[T]
    rest: Counter[str] = field(default_factory=Counter)

    @property
    def hidden(self) -> int:
        return sum(self.rest.values())


def fold(
    items: Sequence[T], at_most: int, rank: Callable[[T], Any], kind: Callable[[T], str]
) -> Folded[T]:
    """The `at_most` items of smallest `rank` (ties in their given order), and the others
    counted by `kind`. O(n log at_most): the cost per item stays flat however many there are."""
    if len(items) <= at_most:
        return Folded(list(items))
    at_most = max(at_most, 0)
    picked = heapq.nsmallest(at_most, range(len(items)), key=lambda i: (rank(items[i]), i))
    chosen = set(picked)
    rest = Counter(kind(item) for i, item in enumerate(items) if i not in chosen)
    return Folded([items[i] for i in picked], rest)


def counts_text(counts: Counter[str]) -> str:
    """'240 running, 12 exited 0, 2 lost': the biggest group first, then by name."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=_biggest_first))


def _biggest_first(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def by_group(pairs: Iterable[tuple[str, str]]) -> dict[str, Counter[str]]:
    """(group, kind) pairs counted per group, groups in the order they first come."""
    groups: dict[str, Counter[str]] = {}
    for group, kind in pairs:
        groups.setdefault(group, Counter())[kind] += 1
    return groups


def tally_lines(pairs: Iterable[tuple[str, str]], noun: str = "tasks") -> list[str]:
    """(role, state) pairs as 'N tasks (worker): 250 running, 6 exited 0', or with several
    roles a total line and one indented line per role."""
    groups = by_group(pairs)
    total: Counter[str] = Counter()
    for counts in groups.values():
        total.update(counts)
    n = sum(total.values())
    if len(groups) == 1:
        return [f"{n} {noun} ({next(iter(groups))}): {counts_text(total)}"]
    lines = [f"{n} {noun}: {counts_text(total)}"]
    for group, counts in groups.items():
        lines.append(f"  {group} {sum(counts.values())}: {counts_text(counts)}")
    return lines


def more_line(folded: Folded[T]) -> str:
    return f"… {folded.hidden} more: {counts_text(folded.rest)}"


NAMES_SHOWN = 8  # a list of names in a step stays one short line: these, then a count


def fold_names(
    names: Sequence[str],
    at_most: int = NAMES_SHOWN,
    join: Callable[[list[str]], str] = join_names,
) -> str:
    """'a, b and c'; past `at_most` names, the first of them and the rest counted by role:
    'worker:0, ..., worker:7 and 142 more (140 worker, 2 ps)'. 150 tasks on a host made one
    step 1,800 characters long, as the table would be without its folding."""
    if len(names) <= at_most:
        return join(list(names))
    shown, rest = names[:at_most], names[at_most:]
    roles: Counter[str] = Counter(n.partition(":")[0] for n in rest if ":" in n)
    kinds = f" ({counts_text(roles)})" if sum(roles.values()) == len(rest) else ""
    return f"{', '.join(shown)} and {len(rest)} more{kinds}"
