"""Small wording helpers shared by everything that prints counts and sizes."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 task', '2 tasks', '0 hosts'; `many` for irregular plurals."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def size(count: int) -> str:
    """Bytes as a person reads them: '812 B', '14.2 KiB', '3.1 MiB'."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def join_names(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


def task_order(task: str) -> tuple[str, int]:
    """chief:0, evaluator:0, ps:0, worker:0, worker:1 ... worker:10: by role, then index."""
    role, _, index = task.partition(":")
    return role, int(index) if index.isdigit() else -1
