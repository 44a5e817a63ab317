#!/usr/bin/env bash
# The vocabulary methods' comparison (configs/eval/vocab_methods.yaml) from a fresh clone: the
# files its methods read (each step skipped when its output exists; the trainers resume), then
# the suite (resumable: rerun to finish). The files' logs under
# eval/results/vocab_methods_pipeline/, the suite's results under eval/results/vocab_methods/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=eval/results/vocab_methods
LOG=eval/results/vocab_methods_pipeline
mkdir -p "$LOG"
T=qwen2.5-coder-1.5b-instruct
D=qwen2.5-coder-0.5b-instruct
CAL=train/calibration

logged() {  # logged LOG CMD...: run CMD, its output shown and appended to LOG under a dated
  local log=$1  # header (a rebuild keeps the first build's log above its own)
  shift
  echo "=== $(date -u +%FT%TZ) vocab_methods_pipeline: $*" >> "$log"
  "$@" 2>&1 | tee -a "$log"
}

[ -f $CAL/target_generated/subset-coverage-latency.npz ] ||
  logged "$LOG/covtrim.log" python -m vocabjax.calibrate select $CAL/target_generated/counts.npz \
    --model $T --coverage-latency --drafter $D \
    --out $CAL/target_generated/subset-coverage-latency.npz
[ -f $CAL/target_generated/successors-n4.npz ] ||
  logged "$LOG/index.log" python -m vocabjax.calibrate index $CAL/target_generated/generated.jsonl \
    --model $T --counts $CAL/stdlib_code/counts.npz --core 8192 --n 4 \
    --out $CAL/target_generated/successors-n4.npz
[ -f train/ranker/vocab_methods/d56/ranker.safetensors ] ||
  logged "$LOG/ranker_d56.log" python -m vocabjax.train.ranker \
    --config configs/train/ranker_qwen05b_d56.yaml --out train/ranker/vocab_methods/d56
[ -f train/ranker/vocab_methods/d112/ranker.safetensors ] ||
  logged "$LOG/ranker_d112.log" python -m vocabjax.train.ranker \
    --config configs/train/ranker_qwen05b_d112.yaml --out train/ranker/vocab_methods/d112
[ -f train/router/c64/router.safetensors ] ||
  logged "$LOG/router.log" python -m vocabjax.train.router \
    --config configs/train/router_qwen05b_c64.yaml
[ -z "${FILES_ONLY:-}" ] || exit 0  # FILES_ONLY=1: the files alone (the combined suite vocab_methods_all reads both)
logged "$LOG/eval.log" python -m vocabjax.eval --config vocab_methods --out "$OUT"
