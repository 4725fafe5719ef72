"""Shared test helpers: write inventories, plan them, run the CLI in-process."""

from __future__ import annotations

import json
import random
import socket
import textwrap
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deployer.cli.main import Env, run
from deployer.config.inventory import Inventory, load_inventory
from deployer.config.plan import Plan, make_plan
from deployer.core.errors import InventoryError
from tests.lab.inventory import toml_key, toml_value

JOB = """\
[job]
name = "j"
code = "code"
command = "python3 train.py"
"""


def write_toml(tmp_path: Path, text: str, *, name: str = "inventory.toml") -> Path:
    """Writes an inventory next to a `code` directory that holds JOB's script (preflight
    refuses a command whose script is not in `code`) and returns its path."""
    (tmp_path / "code").mkdir(exist_ok=True)
    script = tmp_path / "code" / "train.py"
    if not script.exists():
        script.write_text("print('stand-in for the job script')\n")
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


def to_toml(document: dict[str, Any]) -> str:
    """A whole document as top-level `key = value` lines (inline tables and arrays)."""
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in document.items())


# Each would create the marker if any layer (TOML, plan, JSON, ssh, sh -c, supervisor) let a shell
# interpret it; MARK becomes a path on the host.
HOSTILE_STRINGS = [
    "$(touch MARK)",
    "`touch MARK`",
    "; touch MARK",
    "'; touch MARK; '",
    '"; touch MARK; "',
    "\ntouch MARK\n",
    "a && touch MARK || touch MARK",
    "| touch MARK",
    "$HOME ~ * ? [a] {a,b} \\ \\n %s %% ${IFS}",
    "héllo ✓ 日本語 \u00a0 \u202e",
    "-n",
    "'\"'\"'",
]


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive TCP ports nothing on this machine holds right now
    (a job of N tasks on one host takes port, port+1, ...). Drawn below the kernel's ephemeral
    range, so that an outgoing connection made after the check (the suite's ssh, a TF client)
    cannot take one of them: the kernel's own pick (bind to 0) comes from that range."""
    low, high = 20000, 32000
    for _ in range(200):
        base = random.randrange(low, high - count)
        if all(_bindable(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # the wildcard, as TF's servers bind: it clashes with any address
        except OSError:
            return False
        return True


# Two hosts with images by job, host and role (tests of [job] image and its tables).
TWO_HOSTS = """
[[hosts]]
address = "10.0.0.1"
tasks = [{ role = "chief" }, { role = "evaluator" }]

[[hosts]]
address = "10.0.0.2"
image = "host/img:2"
container_runtime = "docker"
tasks = [{ role = "worker" }]
"""
