#!/usr/bin/env bash
# Issue 21's GPU measurements in one budgeted run (a lent H100/H200 gives a session ~15 minutes,
# one command <= 10 minutes). Each step has its own time limit and writes its reports as it goes,
# so a step cut short keeps what it measured; everything lands in $W and is packed into
# $OUT/gpu_bench.tgz after every step (the device tool returns at most 8 files).
#
#   bash eval/gpu_bench.sh            # on the GPU machine, from the repository root
#
# Then, here: unpack, `python -m vocabjax.bench project ...` (CPU-side arithmetic), and copy the
# tables to eval/results/bench/<gpu>/ and kernels/results/<gpu>/ with their commands.
set -u
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
ls -lR "$W" | head -40
