#!/usr/bin/env bash
# The papers' experiment end to end, in order, each part resuming where it stopped:
#   1. the EAGLE head over the target's full vocabulary   (configs/train/eagle_papers/fullvocab.yaml)
#   2. EAGLE-3 proper, its own trained 32K head            (configs/train/eagle_papers/v32k.yaml)
#   3. SpecVocab rankers on the full head's outputs        (configs/train/ranker_papers/*.yaml)
#   4. the suite (papers_small by default) and the report  (configs/eval/papers_small.yaml,
#                                                           eval/papers_report.py)
# Each part appends its console output to a log beside its outputs (train.log / run.log), with a
# dated header line. A finished part reruns in a minute or two (it restores its last checkpoint,
# or the eval finds every question recorded). Run it alone on the machine: part 4 measures
# tokens/s, and part 1 holds ~16 GB.
#
#   nohup nice -n 10 bash eval/papers_pipeline.sh > /tmp/papers_pipeline.log 2>&1 &
#   SUITE=papers bash eval/papers_pipeline.sh        # the full suite (2 + 2 questions)
#   SUITE=papers_t1 bash eval/papers_pipeline.sh     # papers_small at temperature 1, seeds
#
# Stop it with one SIGINT to the running part (`pkill -INT -f "python -m vocabjax"`): training
# saves a checkpoint after its step, the eval keeps every finished question, and the script
# stops (the part exits non-zero). Rerun the same command to go on.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
SUITE="${SUITE:-papers_small}"
case "$SUITE" in  # papers_small -> eval/results/papers/small, papers -> .../full
  papers) where=full ;;
  papers_*) where=${SUITE#papers_} ;;
  *) where=$SUITE ;;
esac
RESULTS="${RESULTS:-eval/results/papers/$where}"

part() {  # part LOG CMD...: run CMD, its output appended to LOG under a dated header
  local log=$1
  shift
  mkdir -p "$(dirname "$log")"
  echo "=== $(date -u +%FT%TZ) papers_pipeline: $*" | tee -a "$log"
  "$@" >> "$log" 2>&1
}

part train/eagle/papers/fullvocab/train.log \
  python -m vocabjax.train.eagle --config configs/train/eagle_papers/fullvocab.yaml
part train/eagle/papers/v32k/train.log \
  python -m vocabjax.train.eagle --config configs/train/eagle_papers/v32k.yaml
for r in d96 d192 d96_tied; do
  part "train/ranker/papers/$r/train.log" \
    python -m vocabjax.train.ranker --config "configs/train/ranker_papers/$r.yaml"
done
part "$RESULTS/run.log" python -m vocabjax.eval --config "$SUITE" --out "$RESULTS"
part "$RESULTS/run.log" python eval/papers_report.py "$RESULTS"
echo "=== $(date -u +%FT%TZ) papers_pipeline: done; the report is $RESULTS/report.md"
