#!/usr/bin/env bash
# Installs everything tfdeploy's test suite needs. Idempotent: a second run only checks.
#   as root (a Debian machine, a container, CI): the system packages with apt, and the venvs under
#     /opt/tfdeploy. Why a venv from Debian's /usr/bin/python3: lab hosts get a private /root and
#     /tmp, so an interpreter living there (pyenv) cannot run inside a lab host.
#   as any other user: a venv under the user's home (or $TFDEPLOY_VENV) with pip, nothing else; no
#     apt, nothing written outside it. What that leaves out is said here and by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
TF_VERSION=${TFDEPLOY_TF_VERSION:-2.21.0}
PIP=(-m pip install -q --disable-pip-version-check)

need_apt=()
for pair in sshd:openssh-server ssh:openssh-client ip:iproute2 rsync:rsync iptables:iptables \
            nft:nftables pdsh:pdsh podman:podman runc:runc catatonit:catatonit newuidmap:uidmap \
            docker-registry:docker-registry; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need_apt+=("${pair#*:}")
done
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# Container tests (docs/containers.md): podman with runc (crun refuses this kernel's hybrid
# cgroups), catatonit for `--init`, uidmap for rootless podman, docker-registry (the registry the
# pull test runs on a lab host), and a static busybox that the lab turns into a 2 MB test image.
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
# `tfdeploy report` pages are checked in real headless Chromium (tests/integration/test_report_browser.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$TFDEPLOY_ROOT" = 1 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "not installed (not root, so no apt): ${need_apt[*]}; the tests that need them skip"
  fi
fi

# The Slurm lab (tests/lab/slurm.py, docs/testing.md): Debian's Slurm 22.05 and munge. Their
# postinst starts the daemons in this machine's own namespace; a temporary policy-rc.d stops that
# (the lab runs them inside its hosts). An existing policy-rc.d (containers have one) is kept.
# libpam-slurm-adopt: the PAM module a compute node's sshd admits sessions with only when the user
# has a job there (the lab's `slurm_adopt`; it changes no PAM file of this machine).
need_slurm=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
  [ -x "/usr/sbin/${pair%%:*}" ] || [ -x "/usr/bin/${pair%%:*}" ] || need_slurm+=("${pair#*:}")
done
[ -e /lib/security/pam_slurm_adopt.so ] || need_slurm+=(libpam-slurm-adopt)
if [ ${#need_slurm[@]} -gt 0 ]; then
  if [ "$TFDEPLOY_ROOT" = 1 ]; then
    export DEBIAN_FRONTEND=noninteractive
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      policy=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    [ ${#need_apt[@]} -gt 0 ] || apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_slurm[@]}" >/dev/null
    if [ -n "$policy" ]; then rm -f "$policy"; trap - EXIT; fi
  else
    echo "not installed (not root, so no apt): ${need_slurm[*]}; the Slurm lab's tests skip"
  fi
fi

# The venv holds the dependencies only, never this checkout: an editable install in a venv that
# several checkouts share (root's /opt/tfdeploy/venv) would re-point it under another checkout's
# running suite. scripts/test.sh (and tests/conftest.py, for every process a test starts) puts the
# checkout first on PYTHONPATH instead, so each checkout tests its own code (docs/testing.md).
if [ -e "$VENV" ] && [ ! -w "$VENV" ]; then
  # Someone else's venv (e.g. root's /opt/tfdeploy/venv given as TFDEPLOY_VENV): used as it is.
  echo "using $VENV as it is: not writable by $(id -un), nothing installed into it"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" "${PIP[@]}" --upgrade pip
# The distribution was called `tfdeploy` until that name turned out to be another project's on
# PyPI: an old editable install of it would shadow this one's `tfdeploy` command.
if "$VENV/bin/python" -m pip show -q tfdeploy >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip uninstall -q -y tfdeploy
fi
# pyproject.toml's dependencies, dev and tensorboard extras, read by the venv's Python 3.11+ (tomllib).
mapfile -t DEPS < <("$VENV/bin/python" -c 'import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
print("\n".join(p["dependencies"] + extras["dev"] + extras["tensorboard"]))')
"$VENV/bin/python" "${PIP[@]}" \
  "tensorflow-cpu==$TF_VERSION" "tensorboard==$TF_VERSION" scikit-learn "${DEPS[@]}"
echo "installed: $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])') venv at $VENV"

if [ "$TFDEPLOY_ROOT" != 1 ]; then
  [ -x "${TFDEPLOY_VENV_TF215:-/opt/tfdeploy/venv-tf215}/bin/python" ] ||
    echo "not made (not root): the TensorFlow 2.15 venv in /opt/tfdeploy; its tests skip"
  [ -x "${TFDEPLOY_VENV_FRAMEWORKS:-/opt/tfdeploy/venv-frameworks}/bin/python" ] ||
    echo "not made (not root): the torch/jax/keras venv in /opt/tfdeploy; its tests skip"
  exit 0
fi
# Hosts with TensorFlow 2.15, the last release with tf.estimator (the Estimator tutorial's test,
# tests/integration/test_seed_programs.py): a second venv from the same Debian Python 3.11, the
# newest Python that 2.15 supports. Only what the digits examples need (~45 s, ~1.5 GB, once).
VENV_TF215=${TFDEPLOY_VENV_TF215:-/opt/tfdeploy/venv-tf215}
TF215_CHECK='import importlib.metadata as m, sys
sys.exit(m.version("tensorflow-cpu") != "2.15.1" or not m.version("scikit-learn"))'
if ! "$VENV_TF215/bin/python" -c "$TF215_CHECK" 2>/dev/null; then
  [ -x "$VENV_TF215/bin/python" ] || /usr/bin/python3 -m venv "$VENV_TF215"
  "$VENV_TF215/bin/python" "${PIP[@]}" "tensorflow-cpu==2.15.1" scikit-learn
fi
echo "installed: tensorflow-cpu 2.15.1 venv at $VENV_TF215"

# Hosts with the frameworks beside TensorFlow (docs/frameworks.md, tests/integration/
# test_frameworks.py): PyTorch (CPU), JAX and Keras 3 in one venv of Debian's Python 3.11. The
# heaviest part of the set-up: ~1.6 GB, ~8 min on a loaded machine (once); torch's CPU wheel
# comes from the machine's pip configuration (the PyTorch CPU index or a local wheel directory).
VENV_FRAMEWORKS=${TFDEPLOY_VENV_FRAMEWORKS:-/opt/tfdeploy/venv-frameworks}
FRAMEWORKS_CHECK='import importlib.metadata as m, sys
sys.exit(not m.version("torch").startswith("2.13.0") or m.version("jax") != "0.10.2"
         or m.version("jaxlib") != "0.10.2" or m.version("keras") != "3.15.1")'
if ! "$VENV_FRAMEWORKS/bin/python" -c "$FRAMEWORKS_CHECK" 2>/dev/null; then
  [ -x "$VENV_FRAMEWORKS/bin/python" ] || /usr/bin/python3 -m venv "$VENV_FRAMEWORKS"
  "$VENV_FRAMEWORKS/bin/python" "${PIP[@]}" "torch==2.13.0" "jax==0.10.2" "jaxlib==0.10.2" \
    "keras==3.15.1" numpy
fi
echo "installed: torch, jax and keras venv at $VENV_FRAMEWORKS"
