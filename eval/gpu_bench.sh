#!/usr/bin/env bash
# Issue 21's GPU measurements in one budgeted run (a lent H100/H200 gives a session ~15 minutes,
# one command <= 10 minutes). Each step has its own time limit and writes its reports as it goes,
# so a step cut short keeps what it measured; everything lands in $W and is packed into
# $OUT/gpu_bench.tgz after every step (the device tool returns at most 8 files).
#
#   bash eval/gpu_bench.sh            # on the GPU machine, from the repository root
#   SET=second bash eval/gpu_bench.sh # what the first set (session 28) left, and whole steps
#
# Then, here: unpack, `python -m vocabjax.bench project ...` (CPU-side arithmetic), and copy the
# tables to eval/results/bench/<gpu>/ and kernels/results/<gpu>/ with their commands.
set -u
case "${SET:-first}" in first|second) ;; *) echo "SET=$SET: choose first or second" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=${W:-/tmp/gpu_bench}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
snap() { tar czf "$OUT/gpu_bench.tgz" -C "$W" --exclude=out . 2>/dev/null; }
step() {  # step NAME SECONDS COMMAND...: run with a limit, log, pack
  local name=$1 secs=$2; shift 2
  echo "== $name (limit ${secs}s): $*" | tee -a "$W/steps.log"
  local t0=$SECONDS
  timeout "$secs" "$@" >"$W/$name.log" 2>&1
  echo "== $name: exit $? after $((SECONDS - t0))s" | tee -a "$W/steps.log"
  tail -n 5 "$W/$name.log"
  snap
}

{ date -u; nvidia-smi; python3 -c "import jax, flax; print('jax', jax.__version__, 'flax',
  flax.__version__, jax.devices())"; } >"$W/env.txt" 2>&1
cat "$W/env.txt"
snap

if [ "${SET:-first}" = first ]; then
  # The indexed LM head on SpecVocab's grid, block sizes tuned per (d, V, k) over a reduced grid.
  step kernel "${KERNEL_S:-170}" python3 kernels/bench_indexed_lm_head.py --out "$W/kernel" \
    --ks 128 512 2048 8192 --repeats 10 --tune-block-k 64 128 256 --tune-block-d 128 256
  # Engine programs of the real pair (target rows first: verification vs one step), bf16, B=1.
  step bench_qwen "${QWEN_S:-200}" python3 -m vocabjax.bench --pair qwen2.5-coder \
    --dtypes bfloat16 --batch 1 --no-progress --out "$W/bench"
  # An 8B-class target (Llama-3.1-8B <- Llama-3.2-1B), fewer drafter heads.
  step bench_llama "${LLAMA_S:-150}" python3 -m vocabjax.bench --pair llama-3.1-8b \
    --dtypes bfloat16 --batch 1 --heads full trim:32768 trim:8192 specvocab:512 specvocab:2048 \
    --head-rows 1 4 --no-progress --out "$W/bench"
else
  # Whole steps of each method as the decoders compile them (eval/step_programs.py) on the
  # real pair's shapes, bf16, with the eagle_gate run's tau for projections.
  step steps_qwen "${STEPS_S:-130}" python3 eval/step_programs.py --pair qwen2.5-coder \
    --dtype bfloat16 --steps 6 --repeats 3 --run eval/results/eagle/gate --out "$W/steps_qwen"
  # Does the per-row (vmapped) path move copy the cache here, as on XLA:CPU? (f32, 1.5B)
  step compact_path "${COMPACT_S:-80}" python3 eval/compact_path.py --repeats 3 --steps 6 \
    --out "$W/compact_path.md"
  # The kernel with software pipelining (num_stages) in the tuning grid, k >= 2048.
  step kernel_stages "${KERNEL_S:-150}" python3 kernels/bench_indexed_lm_head.py \
    --out "$W/kernel_stages" --ks 2048 8192 --repeats 10 --tune-block-k 64 128 \
    --tune-block-d 128 256 --tune-num-warps 4 8 --tune-num-stages 1 3
  # The 8B pair's whole steps: an EAGLE-3 head of Llama-3.1-8B's published size (intermediate
  # 14336, Vd = 32000).
  step steps_llama "${STEPS8_S:-110}" python3 eval/step_programs.py --pair llama-3.1-8b \
    --dtype bfloat16 --steps 6 --repeats 3 --head-intermediate 14336 --head-vocab 32000 \
    --run eval/results/eagle/gate --out "$W/steps_llama"
  # The Qwen2.5-7B pair's programs (never measured), fewer heads.
  step bench_qwen7b "${QWEN7_S:-100}" python3 -m vocabjax.bench --pair qwen2.5-7b \
    --dtypes bfloat16 --batch 1 --heads full trim:32768 specvocab:512 specvocab:2048 \
    --head-rows 1 4 --no-progress --out "$W/bench"
fi
ls -lR "$W" | head -40
