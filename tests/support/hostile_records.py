"""Hostile values for the channels beside the agent's replies (issue 58): a task's metrics lines
(TFDEPLOY_METRICS) and this machine's own run records, generated from a valid record's shape as
tests/unit/test_reply_walk.py generates them from the reply shapes.

A valid record (written by the real writer: the task-side helper, the store, `up`'s facts)
is the shape: every field of it, at any depth, gets each hostile JSON text in turn, every key
each hostile name, and the whole line each hostile form (too long, too many keys, invalid UTF-8,
cut short). The texts are raw JSON, so what no Python value serializes to is sent too: 1,020
nested `[`, `NaN`, a 400-digit number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

PLACE = "@@hostile@@"
DEEP = 1020  # nested levels: past Python's recursion limit, as issue 58's line was

# Raw JSON texts of one value.
HOSTILE_VALUES: list[str] = [
    "[" * DEEP,
    "[" * DEEP + "]" * DEEP,
    '{"a":' * DEEP + "1" + "}" * DEEP,
    "1" * 400,  # an integer no float holds
    "-" + "9" * 5000,  # past Python's int-from-text limit
    "1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    '"x"',
    '"\\u001b]52;c;ZWNobw==\\u0007"',  # OSC 52: writes the clipboard
    '"\\u009b2J\\u001b[2J"',
    '"' + "x" * 5000 + '"',
    '"\\ud800"',  # a lone surrogate
    "true",
    "null",
    "[1, 2]",
    '{"step": 1}',
    "-1",
    "1.5",
    "1e20",
]
# Keys of a record.
HOSTILE_KEYS: list[str] = [
    "k" * 5000,
    "\x1b]52;c;ZWNobw==\x07",
    "loss\x1b[2J",
    "a\x9b2J",
    "",
    "\ud800",
]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _text(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)


def at(document: Any, path: tuple[Any, ...], raw: str) -> str:
    """`document` as JSON text with the value at `path` replaced by the raw JSON text `raw`."""
    copy = json.loads(json.dumps(document))
    holder = copy
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = PLACE
    return _text(copy).replace(json.dumps(PLACE), raw, 1)


def paths(document: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field, item and nested value of `document`, outermost first."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield (*path, key)
            yield from paths(value, (*path, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield (*path, i)
            yield from paths(value, (*path, i))


def renamed(document: Any, path: tuple[Any, ...], key: str) -> str:
    """`document` as JSON text with the key at `path` renamed to `key`."""
    copy = json.loads(json.dumps(document))
    holder = copy
    for step in path[:-1]:
        holder = holder[step]
    holder[key] = holder.pop(path[-1])
    return json.dumps(copy)


def variants(document: Any) -> Iterator[tuple[str, bytes]]:
    """(what, the hostile text as bytes) for `document`: each value at each path, each key at
    each object's path, and the whole text in each hostile form."""
    for path in paths(document):
        for raw in HOSTILE_VALUES:
            yield f"{path} = {raw[:20]!r}", at(document, path, raw).encode("utf-8", "surrogatepass")
        if isinstance(path[-1], str):
            for key in HOSTILE_KEYS:
                text = renamed(document, path, key)
                yield f"key {path} -> {key[:20]!r}", text.encode("utf-8", "surrogatepass")
    for raw in HOSTILE_VALUES:
        yield f"the whole = {raw[:20]!r}", raw.encode("utf-8", "surrogatepass")
    yield from whole_forms(document)


def whole_forms(document: Any) -> Iterator[tuple[str, bytes]]:
    """The document's text in each hostile whole form."""
    text = json.dumps(document)
    if isinstance(document, dict):
        many = {**document, **{f"k{i}": i for i in range(500)}}
        yield "500 more keys", json.dumps(many).encode()
        yield "a huge line", json.dumps({**document, "pad": "x" * 20_000}).encode()
    yield "invalid UTF-8", text.encode()[:-1] + b"\xff\xfe" + text.encode()[-1:]
    yield "cut short", text.encode()[: len(text) // 2]
    yield "empty", b""


def strings_in(value: Any) -> Iterator[str]:
    """Every text of a decoded document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)
