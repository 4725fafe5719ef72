#!/usr/bin/env bash
# The project's test command (README): installs what is missing, then lint, types and the suite.
# Runs as root: the lab of SSH hosts uses network namespaces. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
V=${TFDEPLOY_VENV:-/opt/tfdeploy/venv}
"$V/bin/ruff" check .
"$V/bin/ruff" format --check .
"$V/bin/mypy"
"$V/bin/lint-imports" --no-cache | tail -n +13  # the contracts in pyproject.toml, by name
exec "$V/bin/pytest" -q "$@"
