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
[ -f $CAL/target_generated/subset-coverage-latency.npz ] ||
  python -m vocabjax.calibrate select $CAL/target_generated/counts.npz --model $T \
    --coverage-latency --drafter $D --out $CAL/target_generated/subset-coverage-latency.npz \
    2>&1 | tee "$LOG/covtrim.log"
[ -f $CAL/target_generated/successors-n4.npz ] ||
  python -m vocabjax.calibrate index $CAL/target_generated/generated.jsonl --model $T \
    --counts $CAL/stdlib_code/counts.npz --core 8192 --n 4 \
    --out $CAL/target_generated/successors-n4.npz 2>&1 | tee "$LOG/index.log"
[ -f train/ranker/vocab_methods/d56/ranker.safetensors ] ||
  python -m vocabjax.train.ranker --config configs/train/ranker_qwen05b_d56.yaml \
    --out train/ranker/vocab_methods/d56 2>&1 |
    tee "$LOG/ranker_d56.log"
[ -f train/ranker/vocab_methods/d112/ranker.safetensors ] ||
  python -m vocabjax.train.ranker --config configs/train/ranker_qwen05b_d112.yaml \
    --out train/ranker/vocab_methods/d112 2>&1 |
    tee "$LOG/ranker_d112.log"
[ -f train/router/c64/router.safetensors ] ||
  python -m vocabjax.train.router --config configs/train/router_qwen05b_c64.yaml 2>&1 |
    tee "$LOG/router.log"
[ -z "${FILES_ONLY:-}" ] || exit 0  # FILES_ONLY=1: the files alone (the combined suite vocab_methods_all reads both)
python -m vocabjax.eval --config vocab_methods --out "$OUT" 2>&1 | tee -a "$LOG/eval.log"
