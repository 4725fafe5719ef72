"""What the docs say about the code is read from the code, so it cannot drift: every inventory key
the parser accepts is in docs/inventory.md, every default the README's commands table states is
the one `--help` has, and docs/ describe what holds, not how it came to be."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from deployer.cli.parser import build_parser
from deployer.core.errors import InventoryError
from deployer.sources import load_inventory

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
KNOWN = re.compile(r"unknown key \(known keys here: ([^)]*)\)")

# One unknown key in each table the parser reads; its error lists the keys known there.
_BASE = '[job]\nname = "a"\ncode = "."\ncommand = "x"\n{job}\n{ssh}[[hosts]]\naddress = "h"\n'
PROBES = {
    "top": "zzz = 1\n" + _BASE.format(job="", ssh="") + 'tasks = [{ role = "worker" }]\n',
    "job": _BASE.format(job="zzz = 1", ssh="") + 'tasks = [{ role = "worker" }]\n',
    "job.tensorboard": _BASE.format(job="tensorboard = { logdir = 'l', zzz = 1 }", ssh="")
    + 'tasks = [{ role = "worker" }]\n',
    "ssh": _BASE.format(job="", ssh="[ssh]\nzzz = 1\n") + 'tasks = [{ role = "worker" }]\n',
    "hosts": _BASE.format(job="", ssh="") + 'zzz = 1\ntasks = [{ role = "worker" }]\n',
    "task": _BASE.format(job="", ssh="") + 'tasks = [{ role = "worker", zzz = 1 }]\n',
    "slurm": '[job]\nname = "a"\ncode = "."\ncommand = "x"\n[slurm]\nzzz = 1\nlogin = "l"\n'
    'partition = "p"\ntime = "10"\n[[slurm.hosts]]\nnodes = 1\ntasks = [{ role = "worker" }]\n',
    "slurm.hosts": '[job]\nname = "a"\ncode = "."\ncommand = "x"\n[slurm]\nlogin = "l"\n'
    'partition = "p"\ntime = "10"\n[[slurm.hosts]]\nzzz = 1\nnodes = 1\n'
    'tasks = [{ role = "worker" }]\n',
}


def _known_keys(table: str, tmp_path: Path) -> list[str]:
    path = tmp_path / f"{table}.toml"
    path.write_text(PROBES[table])
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    found = KNOWN.search(str(info.value))
    assert found, f"{table}: no list of known keys in {info.value}"
    return found.group(1).split(", ")


def _every_key_section() -> tuple[str, str]:
    """docs/inventory.md's "Every key": its TOML block, and the prose after it."""
    section = (DOCS / "inventory.md").read_text().split("## Every key", 1)[1].split("\n## ", 1)[0]
    block, _, prose = section.partition("```toml")[2].partition("```")
    return block, prose


@pytest.mark.parametrize("table", list(PROBES))
def test_every_inventory_key_the_parser_accepts_is_in_the_every_key_section(
    table: str, tmp_path: Path
) -> None:
    """[job] and [ssh] keys each have a line of the block (`key = ...`, perhaps commented out);
    a host's or a task's may be named in the prose below it instead."""
    keys = _known_keys(table, tmp_path)
    assert len(keys) >= 3, keys
    block, prose = _every_key_section()
    in_block = set(re.findall(r"^[#\s{]*([a-z_]+) =", block, re.M)) | set(
        re.findall(r"[{,] ([a-z_]+) =", block)
    )
    in_block |= set(re.findall(r"^\[+(?:job\.)?([a-z_.]+)\]+", block, re.M))
    named = in_block | set(re.findall(r"`([a-z_]+)`", prose))
    wanted = in_block if table in ("job", "ssh", "job.tensorboard") else named
    missing = sorted(set(keys) - wanted)
    assert not missing, f"{table} keys docs/inventory.md's Every key does not show: {missing}"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _stated_default(action: argparse.Action) -> str | None:
    """The default `--help` shows: argparse's own, or the `default: X` of its help text (a
    default computed later, such as tunnel's task)."""
    default = action.default
    if default not in (None, False, True, argparse.SUPPRESS):
        return f"{default:g}" if isinstance(default, float) else str(default)
    said = re.search(r"default: \.?/?([^)\s,]+)", action.help or "")
    return said.group(1) if said else None


def _readme_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `tfdeploy (\w+) [^\n]*", text, re.M)}


def test_every_default_of_an_option_the_commands_table_shows_is_the_one_help_has() -> None:
    rows = _readme_rows()
    assert {"up", "down", "pull", "prune", "tunnel"} <= set(rows)
    checked, wrong = 0, []
    for verb, parser in _subparsers().items():
        synopsis = rows[verb].split("` |", 1)[0] if verb in rows else ""
        for action in parser._actions:
            flags = [f for f in action.option_strings if f.startswith("--")]
            default = _stated_default(action)
            if not flags or default is None or flags[0] not in synopsis:
                continue
            checked += 1
            if not re.search(rf"(?<![\w.]){re.escape(default)}(?![\w])", rows[verb]):
                wrong.append(f"{verb} {flags[0]}: --help's default {default} is not in its row")
            if default not in (action.help or ""):
                wrong.append(f"{verb} {flags[0]}: its --help text does not say {default}")
    assert checked >= 4, f"only {checked} defaults checked"
    assert not wrong, wrong


HISTORY = re.compile(
    r"\((?:it|this|that) (?:was|were|said|made|failed|used to|hung|crashed)\b"
    r"|\bbefore (?:issue|#) ?\d+|\bit used to\b",
    re.I,
)


def test_docs_describe_what_holds_not_development_history() -> None:
    assert HISTORY.search("the cell (it was `internal error`)") and HISTORY.search(
        "before issue 28 it hung"
    )
    found = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
        for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        for m in [HISTORY.search(line)]
        if m
    ]
    assert not found, f"development history in the docs (say what holds now): {found}"


@pytest.mark.names_tf(reason="reads the README's commands and inventories; starts nothing")
def test_the_readme_keeps_two_set_up_commands_and_a_screenful_of_pages() -> None:
    """A newcomer's fresh machine needs the quick start's install-and-run and the test command;
    they are the README's only indented command blocks (the others are fenced, in their section),
    and the README stays short enough to read through (the reference is docs/)."""
    text = (ROOT / "README.md").read_text()
    indented = re.findall(
        r"^ {4}(\S.*)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M
    )
    assert indented == [
        'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[examples]" && '
        "tfdeploy up inventories/local.toml",
        "scripts/test.sh",
    ]
    assert len(text.splitlines()) <= 350, "the README grew past 350 lines: move reference to docs/"
