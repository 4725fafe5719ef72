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


def human_size(count: float) -> str:
    """Bytes in decimal units, as progress and tables print them: '812 B', '14 kB', '363 MB',
    '2.1 GB' (three significant digits at most)."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """'42 s', '3m05s', '1h02m': elapsed times and ETAs."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def join_names(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


def task_order(task: str) -> tuple[str, int]:
    """chief:0, evaluator:0, ps:0, worker:0, worker:1 ... worker:10: by role, then index."""
    role, _, index = task.partition(":")
    return role, int(index) if index.isdigit() else -1
