#!/usr/bin/env bash
# The GPU check: one command on the H200 machine that brings every GPU result back in $OUT.
#
#   bash benchmarks/gpu_check.sh                 # on the device (run call: docs/gpu-check.md)
#   bash benchmarks/gpu_check.sh --dry-run       # here: set-ups only, prints what each step would do or skip
#   bash benchmarks/gpu_check.sh --only allreduce,cudf --budget 200   # a rerun of some steps
#   bash benchmarks/gpu_check.sh --cpu --budget 600   # smoke run of the steps' code on CPU workers (~3 min)
#
# Options: --dry-run, --cpu, --budget SECONDS (whole check, wheel install included; default 460),
# --only STEPS, --skip STEPS (comma lists), --out DIR (default $OUT, else a new temp folder).
# Environment: PYTHON (default python3: on the device, the one with torch).
#
# 1. installs the wheels carried in .whl/ (make gpu-wheels) into a private folder and puts it
#    and the repo on PYTHONPATH; 2. saves nvidia-smi's report; 3. hands over to
#    benchmarks/gpu_check.py, which runs the steps in order, each in its own time box, and
#    records each as it ends (results.jsonl, summary.txt). Everything printed goes to log.txt.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
START=$(date +%s)
PY=${PYTHON:-python3}
DRY=0
BUDGET=460
OUT_DIR=${OUT:-}
PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1; PASS+=(--dry-run) ;;
        --cpu) PASS+=(--cpu) ;;
        --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
        --only|--skip) PASS+=("$1" "${2:?$1 needs a comma list of steps}"); shift ;;
        --out) OUT_DIR=${2:?--out needs a folder}; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$OUT_DIR" ]; then
    OUT_DIR=$(mktemp -d /tmp/gpu-check-out.XXXXXX)
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)

main() {
    echo "gpu_check.sh: $(date -u +%FT%TZ), repo $ROOT at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), python $PY, out $OUT_DIR"
    if ! command -v "$PY" >/dev/null 2>&1; then
        echo "gpu_check.sh: no '$PY' here; set PYTHON to the Python that has torch"
        return 2
    fi

    # 1. the carried wheels (a dry run installs them too, into a folder it removes)
    local site=/tmp/quiver-gpu-site status=skipped reason secs=0 t0
    [ "$DRY" = 1 ] && site=$(mktemp -d /tmp/quiver-gpu-site-dry.XXXXXX)
    shopt -s nullglob
    local wheels=(.whl/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        reason="no wheels in .whl/: run 'make gpu-wheels' here and name .whl in the run call's carry, else Dask is missing on the device"
    else
        t0=$(date +%s)
        if timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$site" "${wheels[@]}"; then
            status=ok
        else
            status=failed
        fi
        secs=$(( $(date +%s) - t0 ))
        reason="${#wheels[@]} wheels ($(du -sh .whl | cut -f1)) into $site: $status in ${secs} s"
    fi
    export PYTHONPATH="$site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    if [ "$status" = ok ]; then  # do they import (from $site), with this Python's own packages?
        local imported
        if imported=$(timeout 60 "$PY" -c "import dask, distributed, dask_cuda, mlxtend, sys
print(f'dask {dask.__version__}, distributed {distributed.__version__}, dask_cuda {dask_cuda.__version__}',
      'from the carried wheels' if dask_cuda.__file__.startswith(sys.argv[1]) else f'from {dask_cuda.__file__}')" "$site" 2>&1); then
            reason="$reason; imports: $imported"
        else
            status=failed
            reason="$reason; import check FAILED: $(echo "$imported" | tail -1)"
        fi
    fi
    echo "install: $reason"

    # 2. the GPU as the driver sees it
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 20 nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1
        timeout 20 nvidia-smi -q >> "$OUT_DIR/nvidia-smi.txt" 2>&1
        head -20 "$OUT_DIR/nvidia-smi.txt"
    else
        echo "nvidia-smi: not on this machine" | tee "$OUT_DIR/nvidia-smi.txt"
    fi

    # 3. the steps
    "$PY" benchmarks/gpu_check.py --out "$OUT_DIR" --python "$PY" --start "$START" --budget "$BUDGET" \
        --install-status "$status" --install-seconds "$secs" --install-reason "$reason" "${PASS[@]}"
    local rc=$?
    [ "$DRY" = 1 ] && rm -rf "$site"
    return $rc
}

main 2>&1 | tee -a "$OUT_DIR/log.txt"
exit "${PIPESTATUS[0]}"
