"""Property test: a valid inventory, mutated at random, never crashes `tfdeploy plan`.

Each case drops or renames one key, gives one value a wrong type, replaces one value with a random
string, or corrupts the TOML text. Every case must exit 0 or 2 without a traceback or an internal
error; a mistake exits 2 with one message naming the file and, for structural mistakes, the
mutated key path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.helpers import one_line, run_cli, to_toml

pytestmark = pytest.mark.names_tf(
    reason="reads and plans inventories with tfdeploy:server tasks; starts none"
)

Path_ = tuple[str | int, ...]

VALID: dict[str, Any] = {
    "job": {
        "name": "fuzz",
        "code": "code",
        "command": "python3 t.py {task_type} {task_index} {worker_hosts}",
        "python": "python3",
        "workdir": "~/.tfdeploy",
        "port": 2222,
        "env": {"A": "1", "API_KEY": "k"},
        "setup": ["true", "echo ok"],
        "secret_env": ["A"],
        "start_timeout": 30,
        "role_commands": {"chief": "python3 c.py --ps={ps_hosts}", "ps": "tfdeploy:server"},
    },
    "ssh": {
        "user": "u",
        "port": 22,
        "identity": "~/.ssh/id",
        "host_keys": "strict",
        "connect_timeout": 5.5,
    },
    "hosts": [
        {
            "name": "gpu1",
            "address": "203.0.113.1",
            "tf_address": "10.0.0.1",
            "gpus": 4,
            "ssh": {"user": "root", "jump": "bastion"},
            "tasks": [
                {"role": "chief", "gpus": [0]},
                {"role": "worker", "count": 2, "env": {"B": "2"}},
                {"role": "evaluator", "gpus": [3], "command": "python3 e.py"},
            ],
        },
        {
            "address": "203.0.113.2",
            "port": 3000,
            "share_gpus": False,
            "tasks": [{"role": "ps", "count": 2}, {"role": "worker"}],
        },
    ],
}

# Tables whose keys the user names freely (environment variables, role names).
FREE_FORM = {"env", "role_commands"}
KNOWN_KEYS = {
    "job", "ssh", "hosts", "name", "code", "command", "python", "workdir", "port", "env", "setup",
    "secret_env", "start_timeout", "stop_grace", "evaluator_grace", "role_commands", "user",
    "identity", "jump", "host_keys", "known_hosts", "connect_timeout", "ssh_config", "address",
    "tf_address", "gpus", "share_gpus", "transport", "tasks", "role", "count",
}  # fmt: skip
REQUIRED = {
    ("job",),
    ("job", "name"),
    ("job", "code"),
    ("hosts",),
    ("hosts", 0, "address"),
    ("hosts", 1, "address"),
    ("hosts", 0, "tasks"),
    ("hosts", 1, "tasks"),
    *(("hosts", 0, "tasks", i, "role") for i in range(3)),
    *(("hosts", 1, "tasks", i, "role") for i in range(2)),
}
KEY_PATH = re.compile(r"^[^\s.\[\]]+(\[\d+\])*(\.[^\s.\[\]]+(\[\d+\])*)*$")


def key_path(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def walk(node: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k), v
            yield from walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*path, i), v
            yield from walk(v, (*path, i))


ALL = list(walk(VALID))
KEYS = [p for p, _ in ALL if isinstance(p[-1], str)]
RENAMABLE = [p for p in KEYS if not (len(p) > 1 and p[-2] in FREE_FORM)]
SCALARS = [p for p, v in ALL if not isinstance(v, dict | list)]


def get_parent(doc: Any, path: Path_) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def category(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


WRONG_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    "number": st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False)),
    "str": st.text(max_size=8),
    "list": st.lists(st.integers(-3, 3), max_size=3),
    "dict": st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 3), max_size=2),
}
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=24)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, Path_ | None, set[str]]:
    """(kind, TOML text, mutated path, key paths the message may name)."""
    doc = copy.deepcopy(VALID)
    kind = draw(st.sampled_from(["drop", "rename", "type", "string", "syntax"]))
    if kind == "drop":
        path = draw(st.sampled_from(KEYS))
        del get_parent(doc, path)[path[-1]]
        return kind, to_toml(doc), path, {key_path(path)}
    if kind == "rename":
        path = draw(st.sampled_from(RENAMABLE))
        new = draw(st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True))
        if new in KNOWN_KEYS:
            new += "_x"
        parent = get_parent(doc, path)
        parent[new] = parent.pop(path[-1])
        return kind, to_toml(doc), path, {key_path(path), key_path((*path[:-1], new))}
    if kind == "type":
        path = draw(st.sampled_from([p for p, _ in ALL]))
        parent = get_parent(doc, path)
        wrong = [c for c in WRONG_VALUES if c != category(parent[path[-1]])]
        parent[path[-1]] = draw(WRONG_VALUES[draw(st.sampled_from(wrong))])
        return kind, to_toml(doc), path, {key_path(path)}
    if kind == "string":
        path = draw(st.sampled_from(SCALARS))
        get_parent(doc, path)[path[-1]] = draw(TEXT)
        return kind, to_toml(doc), path, set()
    text = to_toml(doc)
    at = draw(st.integers(0, len(text)))
    return kind, text[:at] + draw(TEXT) + text[at + draw(st.integers(0, 3)) :], None, set()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz")
    (path / "code").mkdir()
    return path


def test_valid_base_inventory_plans(workdir: Path) -> None:
    inventory = workdir / "base.toml"
    inventory.write_text(to_toml(VALID), encoding="utf-8")
    code, out, err = run_cli("plan", "--json", str(inventory))
    assert (code, err) == (0, "")
    assert '"TFDEPLOY_TASK": "evaluator:0"' in out


@pytest.mark.slow  # 600 runs of `plan`: seconds of CPU
@settings(
    max_examples=600,  # derandomized, so the same 600 every run
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(case=mutations())
def test_mutated_inventories_exit_2_with_a_key_path(
    workdir: Path, case: tuple[str, str, Path_ | None, set[str]]
) -> None:
    kind, text, path, keys = case
    inventory = workdir / "inventory.toml"
    inventory.write_text(text, encoding="utf-8")
    code, out, err = run_cli("plan", str(inventory))
    assert "Traceback" not in err and "internal error" not in err, err
    if kind in ("rename", "type") or (kind == "drop" and path in REQUIRED):
        assert code == 2, (kind, path, out)
    assert code in (0, 2), (code, err)
    if code == 0:
        assert err == ""
        return
    assert out == ""
    flat = one_line(err)
    assert flat.startswith(f"error: {inventory}: "), flat
    if kind == "syntax":  # keys may now be anything, e.g. '" workdir"'
        return
    rest = flat.removeprefix(f"error: {inventory}: ")
    reported = rest.split(": ", 1)[0]
    assert KEY_PATH.match(reported), flat
    if keys and not (kind == "drop" and path not in REQUIRED):
        assert reported in keys, (reported, keys, flat)
