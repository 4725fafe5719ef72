"""Which tests start TensorFlow: the static scan behind the `starts_tf` marker (issue 61).

A test is marked `starts_tf` when it starts a TensorFlow process: a task running
examples/digits/*.py, a `tfdeploy:server` task, or Python code that does `import tensorflow`,
on this machine or on lab hosts. The marker says so truthfully, checked at collection
(tests/conftest.py raises a usage error naming each test and what was found; in a pytest-xdist
worker the test errors with the same line instead):

- a test whose scanned text shows one of the SIGNS must be marked `starts_tf`;
- a test marked `starts_tf` whose scanned text shows none must say where it starts TensorFlow
  (`@pytest.mark.starts_tf(reason="...")`: the scan cannot see into, say, an example script);
- a test that shows a sign without starting TensorFlow (it plans, parses or prints an inventory;
  its job's tasks are stand-ins) says so with `@pytest.mark.names_tf(reason="...")`, on the
  test or its module; the two markers on one test are an error.

What is scanned (`scan`), with comments and docstrings left out:
1. the test function's source (its decorators included: parametrize rows);
2. the source of every fixture pytest resolved for it (the closure of fixture names, so a
   fixture's fixtures too) that is defined under tests/;
3. in each of those, the names it references (`NAME` or `module.NAME`), looked up where that
   code was defined, followed two levels deep: a function or class defined under tests/ is
   scanned the same way, a string or path constant (or a list, tuple or dict of them) by value;
4. every inventory that text names: a tests/inventories/*.toml by its name, a .toml of
   tests/inventories/ or inventories/ by its path (`"../inventories/vagrant.toml"`).

SIGNS are matched on the code as written (`"examples" / "digits"` counts) and on the value of
every string in it (`"import tensorflow"` on a line of a script written for a task). It is a
scan of text, not of what runs: a name bound at run time (a fixture's parameter, a file read
from elsewhere) is not followed, which is what `starts_tf(reason=...)` is for.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import types
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
INVENTORIES = TESTS / "inventories"
INVENTORY_FOLDERS = (INVENTORIES, ROOT / "inventories")

SIGNS: dict[str, re.Pattern[str]] = {
    "examples/digits": re.compile(r"examples/digits\b|['\"]examples['\"]\s*/\s*['\"]digits['\"]"),
    "tfdeploy:server": re.compile(r"tfdeploy:server\b"),
    # A line of code: the test's own (TF in pytest's process) or of a script in a string.
    "import tensorflow": re.compile(
        r"^[ \t]*(?:from[ \t]+tensorflow\b"
        r"|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*tensorflow\b)",
        re.M,
    ),
}
DEPTH = 2  # how many levels of referenced names are followed from a test's or fixture's code
# An inventory named in the text: a file of tests/inventories/ by its name, or one of
# tests/inventories/ or inventories/ by its path, absolute or relative to the checkout or a folder
# of it (`INVENTORY = REPO / "inventories" / "vagrant.toml"`, `"../inventories/vagrant.toml"`).
TOML = re.compile(r"\.toml\b")


Found = dict[str, str]  # each sign found, with where it was first seen


def _add(found: Found, text: str, where: str) -> None:
    for sign, pattern in SIGNS.items():
        if sign not in found and pattern.search(text):
            found[sign] = where
    if ".toml" not in text:
        return
    for toml in dict.fromkeys(_tomls(text)):
        for sign, inner in _toml_signs(toml).items():
            found.setdefault(sign, f"{where} -> {toml.relative_to(ROOT)}{inner}")


def _tomls(text: str) -> Iterable[Path]:
    """The .toml files of this checkout that `text` names (see TOML)."""
    for match in TOML.finditer(text):
        begin = match.start()
        while begin > 0 and (text[begin - 1].isalnum() or text[begin - 1] in "_./-"):
            begin -= 1
        name = text[begin : match.end()]
        rest = re.sub(r"^(\.\.?/)+", "", name).lstrip("/")
        for candidate in (Path(name), ROOT / rest, INVENTORIES / Path(name).name):
            if candidate.is_absolute() and candidate.is_file():
                resolved = candidate.resolve()
                if resolved.parent in INVENTORY_FOLDERS:
                    yield resolved
                    break


@cache
def _toml_signs(toml: Path) -> Found:
    found: Found = {}
    for sign, pattern in SIGNS.items():
        if pattern.search(toml.read_text()):
            found[sign] = ""
    return found


@cache
def _under_tests(obj: Any) -> bool:
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        return False
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


@cache
def _parsed(obj: Any) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(code without comments and docstrings, the values of its strings, the names it uses)."""
    source = inspect.getsource(obj)
    # An indented method or nested function: the parser needs only its first line at column 0.
    tree = ast.parse(f"if 1:\n{source}" if source[:1].isspace() else source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    strings = tuple(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    names = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            names.append(f"{n.value.id}.{n.attr}")
        elif isinstance(n, ast.Name):
            names.append(n.id)
    return ast.unparse(tree), strings, tuple(dict.fromkeys(names))


def _values(obj: Any, depth: int = 3) -> Iterable[str]:
    """The strings in a constant: a str or path, or a list, tuple, set or dict of them."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, os.PathLike):
        yield os.fspath(obj)
    elif depth and isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _values(v, depth - 1)
    elif depth and isinstance(obj, dict):
        for k, v in obj.items():
            yield from _values(k, depth - 1)
            yield from _values(v, depth - 1)


@cache
def _code_signs(obj: Any, depth: int) -> Found:
    """The signs in a function or class defined under tests/, and in the names it references
    (`depth` levels more), each with the chain of names that led to it (" -> NAME ...")."""
    found: Found = {}
    if not _under_tests(obj):
        return found
    try:
        code, strings, names = _parsed(obj)
    except (OSError, TypeError, SyntaxError):
        return found
    _add(found, code, "")
    for s in strings:
        _add(found, s, "")
    if isinstance(obj, type):
        namespace = vars(sys.modules[obj.__module__])
    else:
        namespace = getattr(obj, "__globals__", {})
    for name in names:
        head, _, attr = name.partition(".")
        if head not in namespace:
            continue
        value = namespace[head]
        if attr:
            if not isinstance(value, types.ModuleType) or not hasattr(value, attr):
                continue
            value = getattr(value, attr)
        where = f" -> {name}"
        if isinstance(value, (types.FunctionType, type)):
            if depth > 0:
                for sign, inner in _code_signs(inspect.unwrap(value), depth - 1).items():
                    found.setdefault(sign, where + inner)
        elif not isinstance(value, types.ModuleType):
            for s in _values(value):
                _add(found, s, where)
    return found


def scan(item: pytest.Function) -> Found:
    """The signs of TensorFlow in a test, its fixtures and what they reference (see above)."""
    found: Found = {}
    for sign, where in _code_signs(inspect.unwrap(item.function), DEPTH).items():
        found.setdefault(sign, "the test" + where)
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        for fixturedef in info.name2fixturedefs.get(name, ()):
            func = inspect.unwrap(fixturedef.func)
            for sign, where in _code_signs(func, DEPTH).items():
                found.setdefault(sign, f"fixture {name}{where}")
    return found


def words(found: Found) -> str:
    return "; ".join(f"{sign!r} in {where}" for sign, where in found.items())


STARTS = "starts_tf"
NAMES = "names_tf"
NEEDS = "needs_tf"


def problem(item: pytest.Item) -> str | None:
    """What is wrong with a test's `starts_tf` marking, or None."""
    if not isinstance(item, pytest.Function):
        return None
    starts = item.get_closest_marker(STARTS)
    names = item.get_closest_marker(NAMES)
    found = scan(item)
    if starts is not None and names is not None:
        return f"{item.nodeid}: marked both {STARTS} and {NAMES}: it starts TensorFlow or not"
    if found and starts is None and names is None:
        return (
            f"{item.nodeid}: starts TensorFlow ({words(found)}) but is not marked {STARTS}; "
            f"if it only names it (a plan, a parse), mark it "
            f'@pytest.mark.{NAMES}(reason="...")'
        )
    if names is not None and not names.kwargs.get("reason"):
        return f'{item.nodeid}: @pytest.mark.{NAMES} needs reason="..." (why nothing starts)'
    if starts is not None and not found and not starts.kwargs.get("reason"):
        return (
            f"{item.nodeid}: marked {STARTS} but the scan finds none of "
            f"{', '.join(SIGNS)} in it, its fixtures or what they reference: drop the marker, "
            f'or say where it starts TensorFlow with @pytest.mark.{STARTS}(reason="...")'
        )
    return None


WRONG = pytest.StashKey[str]()


def problems(items: list[pytest.Item]) -> list[str]:
    """The problems of a collection, one per test function (not one per parameter set). Each is
    also stashed on its items: under pytest-xdist a worker's usage error reads as a crash, so
    there the `_in_its_tier` fixture (tests/conftest.py) fails the test with it instead."""
    found: dict[str, str] = {}
    for item in items:
        key = item.nodeid.split("[")[0]
        p = found.get(key) or problem(item)
        if p is not None:
            found[key] = p
            item.stash[WRONG] = p
    return list(found.values())
