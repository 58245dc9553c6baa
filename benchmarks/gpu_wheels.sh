#!/usr/bin/env bash
# Fetch the wheels the GPU check carries to the H200 machine (make gpu-wheels).
#
#   bash benchmarks/gpu_wheels.sh            # into .whl/ (git-ignored), then check and measure it
#   bash benchmarks/gpu_wheels.sh --no-ucx   # without the UCX transport's wheels
#
# The device has Python 3.12 and no Dask, and reaches no registry. Here pip resolves the
# project's pins (benchmarks/gpu_wheelset.py roots) for CPython 3.12 on manylinux x86_64
# without installing anything, gpu_wheelset.py keeps what the device lacks, pip downloads
# exactly those versions, and gpu_wheelset.py checks every wheel's Requires-Dist against the
# set plus the device's own packages and measures tree + wheels against the 64 MiB a run call
# may carry (dropping the UCX wheels if they do not fit). docs/gpu-check.md says how to use it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
DEST=.whl
UCX=()
for arg in "$@"; do
    case "$arg" in
        --no-ucx) UCX=(--no-ucx) ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "gpu_wheels.sh: unknown argument '$arg' (use --no-ucx or --help)" >&2; exit 2 ;;
    esac
done

if ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "gpu_wheels.sh: '$PY -m pip' does not run; set PYTHON to a Python with pip (e.g. PYTHON=.venv/bin/python)" >&2
    exit 2
fi

# The device's interpreter and platform (its python3 is CPython 3.12.3 on x86_64).
TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

mapfile -t ROOTS < <("$PY" benchmarks/gpu_wheelset.py roots "${UCX[@]}")
echo "resolving for CPython 3.12 manylinux x86_64: ${ROOTS[*]}"
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$TMP/report.json" \
    --target "$TMP/target" "${TAGS[@]}" "${ROOTS[@]}"
"$PY" benchmarks/gpu_wheelset.py plan "$TMP/report.json" "${UCX[@]}" > "$TMP/want.txt"
echo "carrying $(wc -l < "$TMP/want.txt") wheels: $(tr '\n' ' ' < "$TMP/want.txt")"

rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download --quiet --no-deps "${TAGS[@]}" -d "$DEST" -r "$TMP/want.txt"
"$PY" benchmarks/gpu_wheelset.py check "$DEST" --fit "${UCX[@]}"
