#!/usr/bin/env bash
# Every vocabulary method in one run (configs/eval/vocab_methods_all.yaml) from a fresh clone:
# the drafter's files (eval/vocab_methods_pipeline.sh), the EAGLE head's
# (eval/vocab_methods_eagle_pipeline.sh), OmniDraft's LoRA-distilled SmolLM2 drafter, each step
# skipped or resumed where its output exists, then the suite (resumable: rerun to finish).
# Run it alone on the machine (the head's features hold ~16 GB; the suite measures tokens/s):
#   nohup nice -n 10 bash eval/vocab_methods_all.sh > /tmp/vm_all.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
FILES_ONLY=1 bash eval/vocab_methods_pipeline.sh
FILES_ONLY=1 bash eval/vocab_methods_eagle_pipeline.sh
[ -f train/crossvocab/distill_lora/drafter/drafter.safetensors ] ||
  python -m vocabjax.train.distill --config configs/train/distill_smollm2_qwen15b_lora.yaml
mkdir -p eval/results/vocab_methods_all_pipeline
python -m vocabjax.eval --config vocab_methods_all --out eval/results/vocab_methods_all 2>&1 |
  tee -a eval/results/vocab_methods_all_pipeline/eval.log
