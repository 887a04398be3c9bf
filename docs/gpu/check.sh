#!/bin/bash
# The one-call GPU check (docs/gpu_runbook.md): install the package without network, then every pending
# GPU measurement in priority order (python -m genrec.studies.gpu.check). Results in $OUT: summary.txt,
# gpu_check.json, raw.tar.gz, and this call's log check.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
{
nvidia-smi -L 2>/dev/null || true
# pip's build isolation fetches setuptools (no network there); without a new enough local setuptools,
# a symlink tree on PYTHONPATH stands in for the editable install
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || {
    mkdir -p /tmp/gr/genrec
    for d in platform workloads kernels dashboards studies; do ln -sfn "$PWD/$d" "/tmp/gr/genrec/$d"; done
    export PYTHONPATH=/tmp/gr
}
export PYTHONUNBUFFERED=1
python3 -m genrec.studies.gpu.check --out "$OUT" "$@"
} 2>&1 | tee "$OUT/check.log"
