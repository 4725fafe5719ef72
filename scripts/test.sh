#!/usr/bin/env bash
# The project's test command (README): installs what is missing, then lint, types, the layer
# contracts and the suite. Extra args go to pytest.
#   as root (no sudo needed): everything, the namespace lab of SSH hosts included.
#   as any other user: no apt, nothing outside a venv in the user's home (or $TFDEPLOY_VENV); the
#     in-process tests and the loopback lab run, and what needs root is skipped, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
bash scripts/install.sh
# This checkout's code is the one tested, whatever else shares the venv (scripts/install.sh
# installs no checkout into it): two clones run their suites side by side (docs/testing.md).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# pytest's workers (pytest-xdist): each has its own lab, and lab tests mostly wait on hosts, so
# three workers a core, and an idle worker takes tests queued on a busy one (worksteal), so no
# long test waits at the end behind another (docs/testing.md, "The parallel lab").
# TFDEPLOY_TEST_WORKERS=0: serial.
WORKERS=${TFDEPLOY_TEST_WORKERS:-6}
if [ "$TFDEPLOY_ROOT" != 1 ]; then
  echo "not root ($(id -un)): the lab runs as sshd hosts on 127.0.0.x loopback addresses, and the"
  echo "  tests marked isolated skip: network, PID and mount namespaces, link faults and firewall"
  echo "  rules need root. pytest lists every skip with its reason. Run as root for the full suite."
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
# remote/ as a host imports it (flat modules side by side: `import params`), strict, at the oldest
# Python mypy targets: the agent runs on 3.8+, and vermin holds its syntax and stdlib to that.
(cd remote && MYPYPATH=. "$VENV/bin/mypy" --strict --ignore-missing-imports \
  --explicit-package-bases --python-version 3.10 $(ls -- *.py | grep -vx __init__.py))
"$VENV/bin/vermin" -q -t=3.8- --no-tips --violations remote/  # the agent runs on host Pythons 3.8+
"$VENV/bin/lint-imports" --no-cache | tail -n +13  # the contracts in pyproject.toml, by name
"$VENV/bin/python" scripts/remote_imports.py  # remote/'s layers (remote/importlinter.toml)
# The checks of the house itself (layout, layers, protocol words, docs): with the lint, in seconds,
# before the suite spends its minutes.
"$VENV/bin/python" -m pytest -q tests/meta
# The in-process tier's `slow` tests too (tests/conftest.py); the run fails over its budget
# (suite_budget_s in pyproject.toml, tests/support/budget.py).
exec "$VENV/bin/python" -m pytest -q --run-slow -n "$WORKERS" --dist worksteal --ignore=tests/meta "$@"
