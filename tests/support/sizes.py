"""Sizes as tfdeploy prints them (`398 MB sent`, `0 bytes sent`) read back into numbers, for
tests that compare what a push said with what they measured. Human units keep three
significant digits, two below 10 (`3.1 MB`): compare with a tolerance of 5 %, or compare the
printed text itself (`human_size(n)`)."""

from __future__ import annotations

import re

UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SENT = re.compile(r"(?:(\d+(?:\.\d+)?) (B|kB|MB|GB|TB)|(0) bytes) sent")


def sizes_sent(text: str) -> list[float]:
    """Every `<size> sent` of `text`, in bytes, in order."""
    return [
        float(zero) if zero else float(value) * UNITS[unit]
        for value, unit, zero in _SENT.findall(text)
    ]
