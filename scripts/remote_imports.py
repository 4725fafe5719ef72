"""import-linter over remote/, the agent: the layers in remote/importlinter.toml (scripts/test.sh).

The agent's modules import each other flat (`import params`), as a host runs them side by side,
so import-linter run over the package `remote` sees none of those imports (it takes them for
third-party ones); and it takes only packages as its roots. So each module is copied into a
scratch folder as a one-file package of its own name (`params/__init__.py`), where `import
params` is an import between two roots, and `lint-imports` runs there on the remote contracts
with every module a root package. Line numbers in its report are the modules' own.

Before that it checks the layers against remote/: every module on one layer, and no name on a
layer that is no module (but an optional one, in parentheses), so a new module cannot go
unchecked.

    python scripts/remote_imports.py [LINT_IMPORTS]   # default: lint-imports beside this python
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REMOTE = ROOT / "remote"
CONFIG = REMOTE / "importlinter.toml"
SECTION = "[tool.importlinter]\n"


def modules() -> set[str]:
    """The agent's modules, as protocol.is_pushed counts them (no package marker)."""
    return {p.stem for p in REMOTE.glob("*.py") if p.name != "__init__.py"}


def layer_problems(text: str, found: set[str]) -> list[str]:
    """What the layers and remote/ disagree on."""
    placed: list[str] = []
    optional: set[str] = set()
    for contract in tomllib.loads(text)["tool"]["importlinter"]["contracts"]:
        for layer in contract.get("layers", []):
            for name in (n.strip() for n in re.split(r"[|:]", layer)):
                if name.startswith("(") and name.endswith(")"):
                    name = name[1:-1].strip()
                    optional.add(name)
                placed.append(name)
    problems = [f"{m}.py is on no layer" for m in sorted(found - set(placed))]
    twice = {m for m in placed if placed.count(m) > 1}
    problems += [f"{m} is on more than one layer" for m in sorted(twice)]
    problems += [f"{m}: no such module in remote/" for m in sorted(set(placed) - found - optional)]
    return problems


def main(argv: list[str]) -> int:
    tool = argv[1] if len(argv) > 1 else str(Path(sys.executable).parent / "lint-imports")
    found = modules()
    text = CONFIG.read_text()
    problems = layer_problems(text, found)
    if SECTION not in text:
        problems.append(f"no {SECTION.strip()} table")
    if problems:
        print(f"{CONFIG.relative_to(ROOT)} and remote/ differ:", *problems, sep="\n  ")
        return 1
    roots = f"root_packages = {json.dumps(sorted(found))}\n"
    with tempfile.TemporaryDirectory(prefix="remote-imports-") as scratch:
        for name in found:
            (Path(scratch) / name).mkdir()
            shutil.copyfile(REMOTE / f"{name}.py", Path(scratch) / name / "__init__.py")
        # pyproject.toml: where lint-imports looks for its config, on every version of it
        (Path(scratch) / "pyproject.toml").write_text(text.replace(SECTION, SECTION + roots, 1))
        done = subprocess.run(
            [tool, "--no-cache"],
            cwd=scratch,
            env={**os.environ, "PYTHONPATH": scratch},
            capture_output=True,
            text=True,
        )
    out = done.stdout + done.stderr
    # From the contracts on: the banner above them says nothing of remote/.
    start = out.find("Contracts")
    print((out[start:] if start >= 0 else out).rstrip())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
