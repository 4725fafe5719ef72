"""JSON that this side did not write, or that may have changed on disk since: decoded only once
its nesting is known to be within a bound.

Python's decoder recurses once per level of nesting: a 2 kB line of 1,020 `[` raises
RecursionError, which is no ValueError, so every `except ValueError` around a `json.loads` let
it through as a crash (issue 58: one metrics line a task wrote killed `up`). The depth is
measured first, without recursing (one pass over the brackets outside strings), and a text
nested deeper than its reader's bound is a `TooDeep`, a ValueError like any other bad text.
"""

from __future__ import annotations

import json
import re
from typing import Any

DEPTH = 64  # a local record's nesting at most (a run's facts are 4 deep)
# A string (escapes included, so a quoted bracket is no bracket) or one bracket.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class TooDeep(ValueError):
    """A JSON text nested deeper than its reader reads."""


def too_deep(text: str, limit: int = DEPTH) -> bool:
    """Whether `text` nests its arrays and objects deeper than `limit`. The scan stops at the
    first level past it; a text with no more brackets than `limit` is not scanned at all. An
    unterminated string's brackets count: a text that bad is only refused earlier."""
    if text.count("[") + text.count("{") <= limit:
        return False
    level = 0
    for match in _TOKENS.finditer(text):
        c = match.group()[0]
        if c in "[{":
            level += 1
            if level > limit:
                return True
        elif c in "]}":
            level -= 1
    return False


def loads(text: str, *, limit: int = DEPTH) -> Any:
    """`json.loads(text)`, or ValueError (TooDeep when nested deeper than `limit`)."""
    if too_deep(text, limit):
        raise TooDeep(f"nested deeper than {limit} levels")
    return json.loads(text)
