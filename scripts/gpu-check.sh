#!/usr/bin/env bash
# One-shot check of tfdeploy's GPU support on a real machine (issue 43), in one command and
# under 10 minutes: one NVIDIA GPU, PyTorch built with CUDA, no TensorFlow, no package index.
#
#   scripts/gpu-check.sh WHEELS_DIR [OUTPUT]
#
# Run from a copy of the repository. OUTPUT (default /tmp/tfdeploy-gpu-check/gpu.md) is meant
# for docs/bench/gpu.md: each step's command and output, as Markdown.
#
# Run it as root or as any user that may use the GPU; it starts nothing outside /tmp and stops
# every task it started. Each tfdeploy command is cut after STEP_S seconds (default 240); the
# whole check takes 2 to 4 minutes on an H100.
#
# Prepare beforehand, on any machine with a package index: the wheels of tfdeploy's
# dependencies (pyproject.toml's `dependencies`, with theirs: paramiko needs cryptography,
# bcrypt and PyNaCl, binary wheels), for CPython 3.12 on manylinux x86_64 (a GPU machine with
# another Python needs --python-version of its own: `python3 --version` there):
#
#   pip download --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 \
#       -d wheels 'paramiko>=3.4,<6' 'rich>=13.7' 'pathspec>=0.12' 'packaging>=23'
#
# and copy `wheels/` and this repository to the GPU machine. The script unpacks the wheels into
# /tmp/tfdeploy-gpu-check/site and puts it first on tfdeploy's PYTHONPATH: no pip, venv or
# index is needed there (Debian's and Ubuntu's python3 lack venv without python3-venv), and the
# system's packages (PyTorch) stay visible. TFDEPLOY_PY=/path/to/python skips that and uses a
# Python (3.11+) that already has them. The tasks run with `python3` from PATH (TASK_PY= to
# change): the one with PyTorch.
#
# Steps (each prints what it shows; the first that fails ends the script with exit 1):
#   1. preflight's GPU health check on the real nvidia-smi (`tfdeploy check`); MIG mode is
#      reported and never changed
#   2. gpus = "auto": a task masked to the GPU sees it (CUDA_VISIBLE_DEVICES=0,
#      torch.cuda.device_count() == 1) and a task with gpus = [] sees none
#   3. share_gpus: two tasks on the one GPU at once
#   4. the teardown proof: a task holding 1 GiB is stopped by `down`, which proves the GPU
#      holds no compute process of the run; nvidia-smi is asked again here as well
#   5. the live view's GPU use column with real utilization, in a pseudo-terminal (script -qfec)
set -euo pipefail

WHEELS=${1:?usage: scripts/gpu-check.sh WHEELS_DIR [OUTPUT]}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=/tmp/tfdeploy-gpu-check
OUT=${2:-$WORK/gpu.md}
TASK_PY=${TASK_PY:-python3}
STEP_S=${STEP_S:-240}
DEPENDENCIES=(paramiko rich pathspec packaging cryptography.hazmat.bindings._rust bcrypt nacl.bindings)
rm -rf "$WORK/state" "$WORK/site"
mkdir -p "$WORK" "$(dirname "$OUT")"
: > "$OUT"

say() { printf '%s\n' "$*" | tee -a "$OUT"; }
fail() { say ""; say "FAILED: $*"; exit 1; }
# Runs a command, its output into OUTPUT as a fenced block; returns its exit status.
shown() {
    local code=0
    say ""
    say "\`\`\`"
    say "\$ $*"
    "$@" > "$WORK/last.txt" 2>&1 || code=$?
    tee -a "$OUT" < "$WORK/last.txt"
    say "(exit $code)"
    say "\`\`\`"
    return "$code"
}
# The tasks' own words for a missing PyTorch: the one failure this check cannot get past.
no_torch() { grep -ho "torch with CUDA not found.*" "$WORK/last.txt" "$@" 2>/dev/null | head -1; }
failed() {
    local why
    why=$(no_torch "$@" || true)
    fail "${why:-$1}"
}

# -- tfdeploy's Python -------------------------------------------------------------------------
command -v script > /dev/null || fail "script (util-linux) is needed for step 5's pseudo-terminal"
if [ -n "${TFDEPLOY_PY:-}" ]; then
    PY=$TFDEPLOY_PY
    SITE=
else
    PY=$(command -v python3) || fail "no python3 on PATH (or set TFDEPLOY_PY)"
    SITE=$WORK/site
    compgen -G "$WHEELS/*.whl" > /dev/null \
        || fail "no wheels in $WHEELS: prepare them with the pip download in this script's header"
    # A wheel is a zip of the installed files: unpacked onto the path, it imports as installed.
    "$PY" - "$WHEELS" "$SITE" <<'UNPACK' || fail "cannot unpack the wheels of $WHEELS"
import pathlib, sys, zipfile
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
UNPACK
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); tfdeploy needs 3.11+ (TFDEPLOY_PY=/path/to/python3.11+)"
missing=$(PYTHONPATH=$SITE "$PY" -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        print(f"{name} ({type(e).__name__}: {e})")
' "${DEPENDENCIES[@]}")
[ -z "$missing" ] || fail "$PY ($("$PY" -c 'import platform; print(platform.python_version(), platform.machine())')) cannot import: $missing. The wheels must be for this Python and machine: pip download --python-version X.Y (see this script's header)"
tfdeploy() {
    timeout -k 20 "$STEP_S" env PYTHONPATH="$REPO${SITE:+:$SITE}" TFDEPLOY_STATE_DIR="$WORK/state" \
        "$PY" -m deployer "$@"
}
export COLUMNS=160

say "# tfdeploy on a real GPU: scripts/gpu-check.sh"
say ""
say "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -srm), tfdeploy $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
shown nvidia-smi -L || fail "nvidia-smi -L failed: this check needs a machine with an NVIDIA GPU"
shown nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,memory.total,memory.used \
    --format=csv || true
if nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader 2>/dev/null | grep -qi enabled; then
    say "MIG mode is on: this check leaves it as it is (CUDA_VISIBLE_DEVICES=0 gives a task one MIG instance) and goes on"
fi
shown "$TASK_PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' || true

# -- the inventories: this machine through the local transport, PyTorch programs as tasks -------
CODE=$WORK/code
mkdir -p "$CODE"
cp "$REPO/scripts/gpu-check/gpu_task.py" "$CODE/"
inventory() {  # inventory NAME HOST_KEYS TASKS  -> path
    cat > "$WORK/$1.toml" <<EOF
[job]
name = "gpucheck-$1"
code = "$CODE"
command = "$TASK_PY gpu_task.py see 1"
python = "$TASK_PY"
require_tensorflow = false
port = 22420
start_timeout = 120
stop_grace = 5

[[hosts]]
name = "local"
address = "127.0.0.1"
transport = "local"
gpus = "auto"
$2
tasks = $3
EOF
    printf '%s' "$WORK/$1.toml"
}

say ""
say "## 1. Preflight's GPU health check on the real nvidia-smi"
INV=$(inventory health "" '[{ role = "worker" }]')
shown tfdeploy check "$INV" || failed "tfdeploy check failed: the GPU health check refused this machine's GPU (above)"

"$TASK_PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' > /dev/null 2>&1 \
    || fail "torch with CUDA not found for $TASK_PY: steps 2 to 5 run PyTorch programs on the GPU (TASK_PY=/path/to/python with PyTorch)"

say ""
say "## 2. gpus = \"auto\": the masked task sees the GPU, the one with gpus = [] sees none"
INV=$(inventory mask "" '[{ role = "worker", gpus = [0], command = "'"$TASK_PY"' gpu_task.py see 1" }, { role = "worker", gpus = [], command = "'"$TASK_PY"' gpu_task.py see 0" }]')
shown tfdeploy up "$INV" || failed "the masking step failed (above)"
grep -q "CUDA_VISIBLE_DEVICES=0 torch.cuda.device_count()=1" "$WORK/last.txt" || fail "the masked task did not see exactly one GPU"
grep -q "CUDA_VISIBLE_DEVICES= torch.cuda.device_count()=0" "$WORK/last.txt" || fail "the task with gpus = [] saw a GPU"

say ""
say "## 3. share_gpus: two tasks on the one GPU at once"
INV=$(inventory share "share_gpus = true" '[{ role = "worker", count = 2, gpus = [0], command = "'"$TASK_PY"' gpu_task.py burn 10" }]')
shown tfdeploy up "$INV" || failed "the sharing step failed (above)"

say ""
say "## 4. Teardown proof: down stops a task holding GPU memory; no compute process is left"
INV=$(inventory hold "gpu_release_s = 60" '[{ role = "worker", command = "'"$TASK_PY"' gpu_task.py hold 600" }]')
shown tfdeploy up --detach "$INV" || failed "the holding task did not start (above)"
RUN=$(sed -n 's/.*run \([^ ]*\) is running detached.*/\1/p' "$WORK/last.txt" | head -1)
[ -n "$RUN" ] || fail "up --detach printed no run id"
for _ in $(seq 60); do  # until the task has its 1 GiB
    tfdeploy logs "$RUN" > "$WORK/hold.log" 2>&1 || true
    grep -q "holding" "$WORK/hold.log" && break
    no_torch "$WORK/hold.log" > /dev/null && break
    sleep 1
done
cat "$WORK/hold.log" >> "$OUT"
grep -q "holding" "$WORK/hold.log" || { tfdeploy down "$RUN" > /dev/null 2>&1 || true; failed "the task never held GPU memory" "$WORK/hold.log"; }
shown nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits || true
shown tfdeploy down "$RUN" || fail "down did not prove the GPU free (above)"
shown nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits || true
HELD=$(sed -n 's/.*holding .* pid \([0-9]*\).*/\1/p' "$WORK/hold.log" | head -1)
if [ -n "$HELD" ] && grep -q ", $HELD," "$WORK/last.txt"; then fail "pid $HELD still holds GPU memory after down"; fi

say ""
say "## 5. The live view's GPU use column, in a pseudo-terminal"
INV=$(inventory live "" '[{ role = "worker", command = "'"$TASK_PY"' gpu_task.py burn 25" }]')
code=0
script -qfec "timeout -k 20 $STEP_S env COLUMNS=160 LINES=30 PYTHONPATH=$REPO${SITE:+:$SITE} TFDEPLOY_STATE_DIR=$WORK/state $PY -m deployer up $INV" "$WORK/live.typescript" > /dev/null || code=$?
# The last frame that shows the column, without the terminal's control sequences.
sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\r//g' "$WORK/live.typescript" > "$WORK/live.txt"
say ""
say "\`\`\`"
grep -E "GPU use|worker:0" "$WORK/live.txt" | tail -4 | tee -a "$OUT"
say "(up exit $code)"
say "\`\`\`"
[ "$code" = 0 ] || failed "up in the pseudo-terminal failed (exit $code)" "$WORK/live.txt"
grep -q "GPU use" "$WORK/live.txt" || fail "the live view showed no GPU use column"
grep -Eq "[1-9][0-9]?% [0-9.]+/[0-9.]+ GiB" "$WORK/live.txt" || fail "the GPU use column never showed a non-zero utilization"

say ""
say "All five steps passed in $SECONDS s."
echo "the output is in $OUT: copy it to docs/bench/gpu.md" >&2
