#!/usr/bin/env bash
# Every vocabulary method on an EAGLE head over the target's full head
# (configs/eval/vocab_methods_eagle.yaml) from a fresh clone: the files its methods read, in
# order, each step skipped when its output exists (the trainers resume from their checkpoints),
# then the suite (resumable: rerun to finish). Each part appends its console output to a log
# under eval/results/vocab_methods_eagle_pipeline/ with a dated header line.
#   1. the EAGLE head over the target's full vocabulary (~1 h of target features, then 240
#      steps at ~45 s on a 2-core CPU; train/eagle/papers/README.md)
#   2. SpecVocab's ranker d' = 96 and SlimSpec's factors d' = 192 on the head's outputs
#   3. DynaSpec's router on the same rows (configs/train/router_papers_c64.yaml)
#   4. coverage-latency subsets weighed by the head's cost, EvoSpec's successor index
#   5. the suite
# Run it alone on the machine (part 1 holds ~16 GB; part 5 measures tokens/s):
#   nohup nice -n 10 bash eval/vocab_methods_eagle_pipeline.sh > /tmp/vm_eagle.log 2>&1 &
# Stop it with one SIGINT to the running part (`pkill -INT -f "python -m vocabjax"`); rerun the
# same command to go on.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
OUT=eval/results/vocab_methods_eagle
LOG=eval/results/vocab_methods_eagle_pipeline
mkdir -p "$LOG"
T=qwen2.5-coder-1.5b-instruct
HEAD=train/eagle/papers/fullvocab/head
CAL=train/calibration

part() {  # part LOG CMD...: run CMD, its output appended to LOG under a dated header
  local log=$1
  shift
  echo "=== $(date -u +%FT%TZ) vocab_methods_eagle_pipeline: $*" | tee -a "$log"
  "$@" >> "$log" 2>&1
}

part train/eagle/papers/fullvocab/train.log python -m vocabjax.train.eagle --config configs/train/eagle_papers/fullvocab.yaml
for r in d96 d192; do
  [ -f train/ranker/papers/$r/ranker.safetensors ] ||
    part "$LOG/ranker_$r.log" python -m vocabjax.train.ranker --config configs/train/ranker_papers/$r.yaml
done
[ -f train/router/papers_c64/router.safetensors ] ||
  part "$LOG/router.log" python -m vocabjax.train.router --config configs/train/router_papers_c64.yaml
for c in target_generated stdlib_code; do
  [ -f $CAL/$c/subset-coverage-latency-eagle.npz ] ||
    part "$LOG/covtrim.log" python -m vocabjax.calibrate select $CAL/$c/counts.npz --model $T \
      --coverage-latency --drafter $HEAD --head --out $CAL/$c/subset-coverage-latency-eagle.npz
done
[ -f $CAL/target_generated/successors-n4.npz ] ||
  part "$LOG/index.log" python -m vocabjax.calibrate index $CAL/target_generated/generated.jsonl \
    --model $T --counts $CAL/stdlib_code/counts.npz --core 8192 --n 4 \
    --out $CAL/target_generated/successors-n4.npz
[ -z "${FILES_ONLY:-}" ] || exit 0  # FILES_ONLY=1: the files alone (the combined suite vocab_methods_all reads both)
part "$LOG/eval.log" python -m vocabjax.eval --config vocab_methods_eagle --out "$OUT"
echo "=== $(date -u +%FT%TZ) vocab_methods_eagle_pipeline: done; the summary is $OUT/summary.md"
