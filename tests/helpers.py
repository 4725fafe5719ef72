"""Shared test helpers: write inventories, plan them, run the CLI in-process."""

from __future__ import annotations

import json
import math
import textwrap
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deployer.cli import Env, run
from deployer.errors import InventoryError
from deployer.inventory import Inventory, load_inventory
from deployer.plan import Plan, make_plan

JOB = """\
[job]
name = "j"
code = "code"
command = "python3 train.py"
"""


def write_toml(tmp_path: Path, text: str, *, name: str = "inventory.toml") -> Path:
    """Writes an inventory next to an existing `code` directory and returns its path."""
    (tmp_path / "code").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str) -> Inventory:
    return load_inventory(write_toml(tmp_path, text))


def plan(tmp_path: Path, text: str) -> Plan:
    return make_plan(load(tmp_path, text))


def plan_error(tmp_path: Path, text: str) -> InventoryError:
    """The InventoryError that loading or planning `text` raises (fails the test if none)."""
    path = write_toml(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        make_plan(load_inventory(path))
    assert info.value.path == str(path)
    return info.value


def tf_config(plan_: Plan, name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(plan_.task(name).env["TF_CONFIG"])
    return config


def run_cli(*argv: str) -> tuple[int, str, str]:
    """Runs `tfdeploy ARGV` in-process; returns (exit code, stdout, stderr) as a user sees them."""
    out, err, raw = StringIO(), StringIO(), StringIO()
    env = Env(
        out=Console(width=100, color_system=None, file=out),
        err=Console(width=100, color_system=None, file=err),
        raw_out=raw,
    )
    code = run(list(argv), env)
    return int(code), out.getvalue() + raw.getvalue(), err.getvalue()


def one_line(text: str) -> str:
    """Undoes the console's line wrapping so messages can be compared exactly."""
    return " ".join(text.split())


def _toml_string(value: str) -> str:
    parts = ['"']
    for ch in value:
        if ch in '"\\':
            parts.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            parts.append(f"\\u{ord(ch):04x}")
        else:
            parts.append(ch)
    parts.append('"')
    return "".join(parts)


def toml_value(value: Any) -> str:
    """One TOML value, tables written inline (enough for generated inventories)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{_toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(f"no TOML for {type(value).__name__}")


def to_toml(document: dict[str, Any]) -> str:
    """A whole document as top-level `key = value` lines (inline tables and arrays)."""
    return "".join(f"{_toml_string(k)} = {toml_value(v)}\n" for k, v in document.items())
