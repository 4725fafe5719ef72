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
if [ ! -w "$VENV" ]; then  # someone else's venv, used as it is: this checkout's code comes first
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$TFDEPLOY_ROOT" != 1 ]; then
  echo "not root ($(id -un)): the lab runs as sshd hosts on 127.0.0.x loopback addresses, and the"
  echo "  tests marked isolated skip: network, PID and mount namespaces, link faults and firewall"
  echo "  rules need root. pytest lists every skip with its reason. Run as root for the full suite."
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/vermin" -q -t=3.8- --no-tips --violations remote/  # the agent runs on host Pythons 3.8+
"$VENV/bin/lint-imports" --no-cache | tail -n +13  # the contracts in pyproject.toml, by name
exec "$VENV/bin/pytest" -q --run-slow "$@"  # the in-process tier's `slow` tests too (tests/conftest.py)
