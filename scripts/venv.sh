# Sourced by scripts/install.sh and scripts/test.sh: who runs them, and which venv they use.
# Root gets the machine-wide venv the lab hosts can run; anyone else one in their own home.
if [ "$(id -u)" = 0 ]; then
  TFDEPLOY_ROOT=1
  VENV=${TFDEPLOY_VENV:-/opt/tfdeploy/venv}
else
  TFDEPLOY_ROOT=0
  VENV=${TFDEPLOY_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/tfdeploy/venv}
fi
