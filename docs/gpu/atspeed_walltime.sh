#!/bin/bash
# AtSpeed's walltime target on the lent GPU (issue 16), in one device call of about 5-8 minutes:
# a `base` target and `tiny` drafts (SFT, AtSpeed-S) trained on Beauty there, their AS@10 per N, then
# WS@10 of atspeed_strict against our beam search and HF generate (--hf), batch 1 and 32, one process
# per batch size with the arms alternating. Needs the Beauty data folder carried (see docs/gpu_runbook.md).
#   DATA=.gpu/beauty OUT=$OUT bash docs/gpu/atspeed_walltime.sh
# A CPU dry run of the same steps, small: DEVICE=cpu EPOCHS=1 USERS=4 TARGET_SIZE=tiny bash ...
set -euo pipefail
DATA=${DATA:-.gpu/beauty}
OUT=${OUT:-/tmp/atspeed_gpu}
DEVICE=${DEVICE:-cuda}
EPOCHS=${EPOCHS:-8}
USERS=${USERS:-128}
TARGET_SIZE=${TARGET_SIZE:-base}
MODELS=${MODELS:-/tmp/atspeed_gpu_models}
PY=${PY:-python}
mkdir -p "$OUT"
$PY -m genrec.studies.atspeed.atspeed_objectives --data "$DATA" --models-dir "$MODELS" \
    --target-size "$TARGET_SIZE" --draft-size tiny --objectives atspeed_s sft --seeds 0 --epochs "$EPOCHS" \
    --k 10 --draft-beams 40 20 10 --gamma 3 --users "$USERS" --threads 0 --device "$DEVICE" \
    --out "$OUT/atspeed_gpu_objectives.json"
target=$(ls -d "$MODELS"/target-"$TARGET_SIZE"-seed0-*/ | head -n 1)
for objective in atspeed_s sft; do
    draft=$(ls -d "$MODELS"/draft-tiny-"$objective"-seed0-*/ | head -n 1)
    for batch in 1 32; do
        users=$((batch == 1 ? USERS / 2 : USERS * 2))
        $PY -m genrec.studies.atspeed.atspeed_latency --model "$target" --draft "$draft" --data "$DATA" \
            --k 10 --draft-beams 10 20 40 --gamma 3 --users "$users" --batch-size "$batch" --repeats 3 \
            --warmup 2 --threads 0 --device "$DEVICE" --hf --out "$OUT/atspeed_latency_${objective}_b${batch}.json"
    done
done
