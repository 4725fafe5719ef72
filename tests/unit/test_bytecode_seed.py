"""Bytecode seeding (remote/bytecode.py) on this machine's file system, with real venv layouts
and this interpreter compiling: a new venv gets bytecode for the modules another venv's tasks
imported, compiled by the seeding into the host's store, never that venv's own `.pyc` files
(issue 58: a task's rewritten `.pyc` ran in another job's venv); an entry rewritten in place
through a venv's link is found changed and compiled again."""

from __future__ import annotations

import importlib.util
import marshal
import os
import subprocess
import sys
from pathlib import Path

from remote import bytecode

VERSION = ".".join(map(str, sys.version_info[:3]))
MODULES = 150  # more than one compiling process' worth (bytecode.PER_WORKER)


def _venv(root: Path, name: str) -> Path:
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    return venv


def _site(venv: Path) -> Path:
    found = bytecode.site_packages(venv, VERSION)
    assert found is not None
    return found


def _poison(pyc: Path, source: Path) -> None:
    """`pyc` rewritten in place with code that prints POISONED, stamped so Python takes it."""
    st = source.stat()
    head = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    head += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    head += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    with open(pyc, "r+b") as f:
        f.truncate(0)
        f.write(head + marshal.dumps(compile("print('POISONED')", str(source), "exec")))


def _imported(venv: Path, module: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    argv = [
        sys.executable,
        "-S",
        "-c",
        f"import sys; sys.path.insert(0, {str(_site(venv))!r}); import {module}",
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout


def test_a_new_venv_gets_the_stores_bytecode_never_a_sibling_venvs_own(tmp_path: Path) -> None:
    old, new, store = _venv(tmp_path, "a"), _venv(tmp_path, "b"), tmp_path / "store"
    for i in range(MODULES):
        source = _site(old) / f"mod{i}.py"
        source.write_text(f"VALUE = {i}\nprint('clean', VALUE)\n")
        os.link(source, _site(new) / source.name)  # one file in both, as uv links them
    # A task of `old` imports (and so compiles) every module.
    _imported(old, ", ".join(f"mod{i}" for i in range(MODULES)))
    poisoned = Path(importlib.util.cache_from_source(str(_site(old) / "mod0.py")))
    _poison(poisoned, _site(old) / "mod0.py")
    assert "POISONED" in _imported(old, "mod0")  # the rewrite is real in its own venv

    assert bytecode.seed(new, VERSION, [old], store) == MODULES
    assert _imported(new, "mod0").strip() == "clean 0"
    mine = Path(importlib.util.cache_from_source(str(_site(new) / "mod0.py")))
    assert mine.stat().st_ino != poisoned.stat().st_ino and mine.stat().st_nlink == 2
    _imported(new, "mod0")  # Python took it as valid: it did not write a file of its own
    assert mine.stat().st_nlink == 2

    # A task of `new` rewrites its linked .pyc in place: that is the store's file too.
    _poison(mine, _site(new) / "mod0.py")
    third = _venv(tmp_path, "c")
    os.link(_site(old) / "mod0.py", _site(third) / "mod0.py")
    assert bytecode.seed(third, VERSION, [new, old], store) == 1
    assert _imported(third, "mod0").strip() == "clean 0"


def test_a_fill_while_the_old_venv_trains_leaves_the_next_seed_nothing_to_compile(
    tmp_path: Path,
) -> None:
    """bytecode.fill (the supervisor runs it once a task reported its first step) compiles the
    store from what the venv's tasks imported, from the modules' sources, never their `.pyc`
    bytes; the next venv's seeding then links those entries and compiles none (issue 58: the
    "+1 requirement" `up` waited 8 s for TensorFlow's imports to compile)."""
    old, new, store = _venv(tmp_path, "a"), _venv(tmp_path, "b"), tmp_path / "store"
    for i in range(MODULES):
        source = _site(old) / f"mod{i}.py"
        source.write_text(f"VALUE = {i}\nprint('clean', VALUE)\n")
        os.link(source, _site(new) / source.name)
    _imported(old, ", ".join(f"mod{i}" for i in range(MODULES)))
    pyc = Path(importlib.util.cache_from_source(str(_site(old) / "mod0.py")))
    _poison(pyc, _site(old) / "mod0.py")

    argv = bytecode.fill_argv(old, VERSION, store)
    subprocess.run(argv, check=True, env={"PATH": os.environ["PATH"]})
    shelf = store / f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    entries = sorted(p for p in shelf.iterdir() if p.name.endswith(".pyc"))
    assert len(entries) == MODULES
    assert bytecode.fill(old, VERSION, store) == 0  # a second fill finds nothing to do
    stamps = {p.name: p.stat().st_mtime_ns for p in entries}

    assert bytecode.seed(new, VERSION, [old], store) == MODULES
    assert {p.name: p.stat().st_mtime_ns for p in entries} == stamps  # linked, none compiled
    assert _imported(new, "mod0").strip() == "clean 0"  # from the source, not the poisoned .pyc


def test_a_fill_whose_parent_is_gone_stops(tmp_path: Path) -> None:
    """The supervisor is the fill's parent: a fill whose supervisor died (its run stopped)
    compiles nothing more."""
    old, store = _venv(tmp_path, "a"), tmp_path / "store"
    for i in range(5):
        (_site(old) / f"mod{i}.py").write_text(f"VALUE = {i}\n")
    _imported(old, ", ".join(f"mod{i}" for i in range(5)))
    assert bytecode.fill(old, VERSION, store, parent=os.getppid() + 1) == 0
    assert bytecode.fill(old, VERSION, store, parent=os.getppid()) == 5
