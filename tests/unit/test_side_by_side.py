"""Any checkout, any user (docs/testing.md, "Side by side checkouts"): what the tests start runs
this checkout's code, whatever the shared venv holds, and the fast tier needs no /opt venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def test_a_process_a_test_starts_imports_this_checkouts_code() -> None:
    # From / with the venv's Python: only PYTHONPATH (tests/conftest.py) can point it here; an
    # editable install of another checkout in the venv would win otherwise.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import deployer, remote; print(deployer.__file__, remote.__file__)",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        str(CHECKOUT / "deployer" / "__init__.py"),
        str(CHECKOUT / "remote" / "__init__.py"),
    ]
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(CHECKOUT)
