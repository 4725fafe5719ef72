#!/usr/bin/env bash
# Installs everything tfdeploy's test suite needs on a fresh Debian machine (run as root).
# Idempotent: a second run only checks. Why a venv from Debian's /usr/bin/python3: lab hosts get a
# private /root and /tmp, so an interpreter living there (pyenv) cannot run inside a lab host.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TFDEPLOY_VENV:-/opt/tfdeploy/venv}
TF_VERSION=${TFDEPLOY_TF_VERSION:-2.21.0}

need_apt=()
for pair in sshd:openssh-server ssh:openssh-client ip:iproute2 rsync:rsync iptables:iptables \
            nft:nftables pdsh:pdsh; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need_apt+=("${pair#*:}")
done
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "tensorflow-cpu==$TF_VERSION" "tensorboard==$TF_VERSION" scikit-learn -e ".[dev]"
echo "installed: $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])') venv at $VENV"
