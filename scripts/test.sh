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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, whatever the venv has
if [ "$TFDEPLOY_ROOT" != 1 ]; then
  echo "not root ($(id -un)): the lab runs as sshd hosts on 127.0.0.x loopback addresses; skipped:"
  echo "  tests marked isolated (network, PID and mount namespaces, link faults, firewall rules)"
  echo "  and the TensorFlow 2.15 hosts: they need root. pytest lists each skip and its reason."
  echo "  Run this script as root for the full suite."
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/lint-imports" --no-cache | tail -n +13  # the contracts in pyproject.toml, by name
exec "$VENV/bin/pytest" -q "$@"
