#!/usr/bin/env bash
# The GPU measurements in one budgeted run (a lent H100/H200 gives ~15 device minutes,
# one command <= 10 minutes). Each step has its own time limit and writes its reports as it goes,
# so a step cut short keeps what it measured; everything lands in $W and is packed into
# $OUT/gpu_bench.tgz after every step (the device tool returns at most 8 files).
#
#   bash kernels/gpu_bench.sh             # on the GPU machine, from the repository root: SET=kernel
#   SET=first bash kernels/gpu_bench.sh   # the first H200 run's set (kernel grid, engine programs)
#   SET=second bash kernels/gpu_bench.sh  # the H100 run's set (whole steps, path move, 8B, 7B)
#   SET=quant bash kernels/gpu_bench.sh   # weight-only int8 / grouped int4 against bf16 (below)
#
# SET=kernel (the default; BUDGET_S=570 s of commands, ~12 device minutes with the machine's
# start; each step's limit is capped by what is left of BUDGET_S, and SKIP="name ..." leaves
# steps out): the Triton kernel smoke-tested; tuned against XLA with device-side timing at
# B = 10 (SpecVocab's bars: d >= 2560, k >= 2048; k = 2048, 4096 and 8192), again at k = 2048
# repeated (for the dispatch table's history), and at the real drafters' B = 1 widths (writing
# the dispatch table the next steps use); the decoding exactness tests on the GPU in f32 and
# bf16 (150 s a dtype: a fresh machine compiles every test's programs); the plain step at
# 1,024 and 16,384 cache slots (what a longer cache costs); whole SpecVocab chain steps with
# the kernel and with XLA against the full-vocabulary chain (last: what is left).
# PERSIST=1 adds, right after the smoke test, the persistent grid against one program per tile
# at k = 2048, twice (answered on the H200 on 2026-11-28, nvidia-h200/2026-11-28_persistent_grid/: no faster).
# `DRY=1` runs the same steps on the CPU at tiny shapes (interpret mode;
# tests/eval/test_gpu_bench.py) to check the script, not to measure.
#
# The lent machines have had no `gguf` (the quantized paths import it) and no network: carry its
# pure-Python package (`mkdir -p .carry && cp -r .venv/lib/python3.11/site-packages/gguf .carry/`,
# `.carry` ignored by git; the device call's `carry: [".carry"]`) and this script copies it into
# the machine's site-packages before the first step.
#
# Then, here: unpack, `python -m vocabjax.bench project ...` (CPU-side arithmetic), and copy the
# tables to kernels/results/bench/<gpu>/ and kernels/results/kernels/<gpu>/ with their commands.
set -u
SET=${SET:-kernel}
case "$SET" in kernel|first|second|quant) ;; *) echo "SET=$SET: choose kernel, first, second or quant" >&2; exit 2;; esac
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=${W:-/tmp/gpu_bench}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
snap() { tar czf "$OUT/gpu_bench.tgz" -C "$W" --exclude=out . 2>/dev/null; }
BUDGET_S=${BUDGET_S:-570}  # the whole run's commands; each step's limit is capped by what is left
SKIP=${SKIP:-}             # step names not to run, e.g. SKIP="exactness kernel_b1"
step() {  # step NAME SECONDS COMMAND...: run with a limit, log, pack
  local name=$1 secs=$2; shift 2
  if [[ " $SKIP " == *" $name "* ]]; then
    echo "== $name: skipped (SKIP)" | tee -a "$W/steps.log"; return 0
  fi
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, ${left}s of BUDGET_S=$BUDGET_S left" | tee -a "$W/steps.log"; return 124
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "== $name (limit ${secs}s): $*" | tee -a "$W/steps.log"
  local t0=$SECONDS
  timeout "$secs" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$W/steps.log"
  tail -n 5 "$W/$name.log"
  snap
  return $rc
}

if ! python3 -c "import gguf" 2>/dev/null && [ -d .carry/gguf ]; then
  cp -r .carry/gguf "$(python3 -c 'import site; print(site.getsitepackages()[0])')/" \
    && echo "gguf: copied from .carry into site-packages"
fi
{ date -u; nvidia-smi; python3 -c "import jax, flax; print('jax', jax.__version__, 'flax',
  flax.__version__, jax.devices())"
  python3 -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda|flax|optax|gguf|transformers|torch|pytest|triton) "; } >"$W/env.txt" 2>&1
cat "$W/env.txt"
snap

if [ "$SET" = kernel ]; then
  K=kernels/bench_indexed_lm_head.py
  TABLE=vocabjax/kernels/dispatch_table.json
  if [ -n "${DRY:-}" ]; then  # CPU: interpret mode, tiny shapes, two configurations
    cp "$TABLE" "$W/dry_table.json"; TABLE="$W/dry_table.json"  # never the package's own
    KB10=(--interpret --tune --shapes 128:1000 --ks 40 --batch 2 --repeats 1 --calls 1
          --copy-mib 8 16 --tune-block-k 64 --tune-block-d 64 --tune-num-warps 4 --tune-split-d 1)
    KB1=("${KB10[@]}")
    KK=("${KB10[@]}" --contiguous)
    KP=("${KB10[@]}" --tune-variant dot --tune-persist 0 2 --contiguous)
    SMOKE_SHAPE=(2 256 1000 40)
    SMOKE_PERSIST=${DRY_SMOKE_PERSIST:-2}  # tests set -1 (refused) to check the skip below
    STEPS=(--target "$DRY_TARGET" --draft "$DRY_DRAFT" --context 16 --max-len 96 --steps 2
           --repeats 1 --ranker-rank 8 --methods ar chain_g3 sv16_g3_xla sv16_g3_auto)
    EXACT=(--dtypes float32 --files tests/vocab/test_trimmed.py -k "greedy and chain and float32")
    SLOTS=(--target "$DRY_TARGET" --draft "$DRY_DRAFT" --context 16 --steps 2 --repeats 1
           --methods ar ar+sum)
    EXACT_SUM=("${EXACT[@]}")
    SLOT_LENS=(96 128)
    INTERP=True
  else
    # k = 4096 (since 2026-11-28): between 2048 (XLA fuses the gather into its dot, the kernel
    # level with it) and 8192 (XLA writes the gathered rows, the kernel 3.4x): where the kernel
    # starts to pay.
    KB10=(--batch 10 --shapes 4096:151936 2560:151936 --ks 2048 4096 8192 --calls 4 --repeats 10
          --tune-num-warps 4 8 --hlo-dump)
    KB1=(--batch 1 --shapes 896:151936 2048:128256 --ks 2048 512 --calls 32 --repeats 10
         --tune-num-warps 4 --tune-block-d 128)
    # k = 2048 at B = 10: the grid of nvidia-h200/2026-11-27_device_timed/ (block_k 64-256, block_d 128-256,
    # 3-4 stages, split 1-8) and that of 2026-11-28_k2048_grid/ (block_k 16-64, block_d 128-512, 3-6 stages) both put
    # 64 / 128 / 3 stages / split 1 first, and runs disagree by 10-20% there
    # (kernels/results/kernels/nvidia-h200/2026-11-28_k2048_grid/): the kernel and XLA are level. So this
    # step repeats the best few configurations at both widths with more repeats, for the
    # dispatch table's history (the kernel is chosen only where it won every recorded run).
    # --contiguous times both again on runs of consecutive rows (the same bytes): if both then
    # reach the full head's ~86% of read bandwidth, random row order, not the kernel, is what
    # holds them at ~60-65%, and no tiling gets the kernel 1.3x past XLA at this size.
    # num_warps 2 was never tried (4 beat 8 at every small tile in nvidia-h200/2026-11-28_k2048_grid/).
    KK=(--batch 10 --shapes 4096:151936 2560:151936 --ks 2048 --calls 16 --repeats 30
        --tune-variant dot fma --tune-block-k 64 128 --tune-block-d 128 --tune-num-warps 2 4 8
        --tune-num-stages 3 --tune-split-d 1 --contiguous)
    # A persistent grid (`persist`: 2 / 4 programs per SM, 264 / 528 on 132 SMs, each an equal
    # share of the (tile, chunk) iterations in one pipelined loop) against one program per tile
    # (320 tiles: some SMs run 3, most 2; `kernels/results/kernels/triton_inspect/`), in
    # one step so both are timed in the same minutes. Not merged into the dispatch table here
    # (`--from-results` after reading it): the k2048 step below is the table's run.
    # (Triton 3.9 pipelines the persistent loop with fewer buffers of U per num_stages, the
    # per-iteration index load taking stages: 3 -> 2, 5 -> 3, 7 -> 4 buffers.)
    KP=(--batch 10 --shapes 4096:151936 2560:151936 --ks 2048 --calls 16 --repeats 30
        --tune-variant dot --tune-block-k 32 64 --tune-block-d 128 --tune-num-warps 4
        --tune-num-stages 3 5 7 --tune-split-d 1 --tune-persist 0 --tune-persist-per-sm 2 4
        --contiguous)
    SMOKE_SHAPE=(10 4096 151936 2048)
    SMOKE_PERSIST=264
    STEPS=(--pair qwen2.5-coder --dtype bfloat16 --steps 6 --repeats 3
           --methods ar chain_g3 sv2048_g3_xla sv2048_g3_kernel)
    EXACT=(--dtypes float32 bfloat16 --workers 12)
    SLOTS=(--pair qwen2.5-coder --dtype bfloat16 --steps 6 --repeats 3 --methods ar ar+sum)
    # shellcheck disable=SC2206  # EXACT_SUM_DTYPES="bfloat16": one dtype when time is short
    EXACT_SUM=(--dtypes ${EXACT_SUM_DTYPES:-bfloat16 float32} --workers 12)
    SLOT_LENS=(1024 16384)
    INTERP=False
  fi
  # 1. Does the reworked kernel compile and agree with the reference here (both variants)?
  # (The persistent grid is checked too; if it alone fails, the other steps still run.)
  [[ " $SKIP " == *" kernel_smoke "* ]] || rm -f "$W/persist_failed"
  step kernel_smoke "${SMOKE_S:-45}" python3 -c "
import sys, jax, jax.numpy as jnp, numpy as np
from vocabjax.kernels.indexed_lm_head import indexed_lm_head_gpu, indexed_lm_head_reference
B, D, V, K = map(int, sys.argv[1:5])
k = jax.random.key(0)
U = (jax.random.normal(k, (V, D)) * 0.02).astype(jnp.bfloat16)
h = jax.random.normal(jax.random.fold_in(k, 1), (B, D)).astype(jnp.bfloat16)
idx = jax.random.randint(jax.random.fold_in(k, 2), (B, K), 0, V)
ref = np.asarray(indexed_lm_head_reference(h.astype(jnp.float32), U.astype(jnp.float32), idx))
bad, bad_persist = 0, 0
for variant in ('fma', 'dot'):
  for split, persist in ((1, 0), (2, 0), (1, $SMOKE_PERSIST)):
    try:
      got = np.asarray(jax.jit(lambda h, U, i: indexed_lm_head_gpu(h, U, i, variant=variant,
                       split_d=split, persist=persist, interpret=$INTERP))(h, U, idx))
      err = float(np.abs(got - ref).max() / np.abs(ref).max())
      print(variant, split, persist, 'max rel err', err); ok = err <= 1e-2
    except Exception as e:
      print(variant, split, persist, 'FAILED', type(e).__name__, str(e)[:2000]); ok = False
    if persist:
      bad_persist += not ok
    else:
      bad += not ok
if bad_persist:  # the new grid alone failed: the established kernel is still measured
  print('the persistent grid failed: kernel_persist steps skipped')
  open(sys.argv[5], 'w').write('the persistent grid failed its smoke test\n')
sys.exit(1 if bad else 0)
" "${SMOKE_SHAPE[@]}" "$W/persist_failed"
  smoke=$?
  if [ "$smoke" = 0 ]; then
    # 2. With PERSIST=1: the persistent grid against one program per tile at k = 2048 (see KP
    # above), twice; two runs of the new grid for the table's history (`--from-results`, the
    # first with `--no-table-history` if the persistent grid wins: it is a new kernel).
    if [ -z "${PERSIST:-}" ]; then
      :  # answered on the H200 (kernels/results/kernels/nvidia-h200/2026-11-28_persistent_grid/)
    elif [ -e "$W/persist_failed" ]; then
      echo "== kernel_persist: skipped (the persistent grid failed kernel_smoke)" | tee -a "$W/steps.log"
    else
      step kernel_persist "${KP_S:-80}" python3 "$K" --out "$W/kernel_persist" "${KP[@]}"
      step kernel_persist2 "${KP_S:-80}" python3 "$K" --out "$W/kernel_persist2" "${KP[@]}"
    fi
    # 2b. The bars' shapes (B = 10), device-timed, tuned; the table the steps below read.
    step kernel_b10 "${KB10_S:-120}" python3 "$K" --out "$W/kernel_b10" "${KB10[@]}" \
      --update-table "$TABLE"
    # 2c. k = 2048 repeated (the kernel and XLA are level there; see above).
    step kernel_k2048 "${KK_S:-90}" python3 "$K" --out "$W/kernel_k2048" "${KK[@]}" \
      --update-table "$TABLE"
    # 3. The real drafters' widths at B = 1 (Qwen2.5-0.5B d = 896, Llama-3.2-1B d = 2048).
    step kernel_b1 "${KB1_S:-60}" python3 "$K" --out "$W/kernel_b1" "${KB1[@]}" \
      --update-table "$TABLE"
    cp "$TABLE" "$W/dispatch_table.json"; snap
  else
    echo "== the kernel failed its smoke test: tuning skipped (kernel_smoke.log)" | tee -a "$W/steps.log"
  fi
  # 4. The decoding exactness tests on this backend, f32 and bf16 (the GPU check of item 4).
  step exactness "${EXACT_S:-360}" python3 eval/gpu_exactness.py --out "$W/exactness" \
    --limit-s "${EXACT_EACH_S:-150}" "${EXACT[@]}"
  # 4b. The plain step at 1,024 and 16,384 cache slots (same 512-token context): compiled
  # deviceless here, XLA:GPU's step rewrites the whole K and V caches four times (a copy and
  # three transposes, kernels/results/gpu_cache_traffic/): if so, the step grows by ~5x
  # the extra cache's bytes (~0.5 ms on an H200 for the 1.5B), not 1x (attention's read).
  # `ar+sum`: the same step with Lowering.sum_attention, which compiled deviceless writes the
  # cache slots in place (no rewrites); 4c then runs the exactness tests with it.
  for slots in "${SLOT_LENS[@]}"; do
    step "steps_slots$slots" "${SLOTS_S:-60}" python3 kernels/step_programs.py \
      "${SLOTS[@]}" --max-len "$slots" --out "$W/steps_slots$slots"
  done
  # 4c. The exactness tests with attention by summed products (bf16 first: the GPU's own
  # numerics, where a flip would show).
  step exactness_sum "${EXACT_SUM_S:-360}" python3 eval/gpu_exactness.py \
    --out "$W/exactness_sum" --limit-s "${EXACT_EACH_S:-150}" --sum-attention "${EXACT_SUM[@]}"
  # 5. Whole SpecVocab chain steps (kernel and XLA) against the full-vocabulary chain.
  step steps_specvocab "${STEPS_S:-200}" python3 kernels/step_programs.py "${STEPS[@]}" \
    --out "$W/steps_specvocab"
elif [ "$SET" = quant ]; then
  # Weight-only int8 (per-row scales) and grouped int4 (Q4_0's values) against bf16 weights,
  # whole steps as the decoders compile them: int4 through vocabjax's Triton kernel
  # (vocabjax.kernels.grouped_int4_gpu) and, `int4_xla`, through XLA's own dot
  # (VOCABJAX_GPU_INT4_KERNEL=0: each matrix widened in HBM, as recorded on an H200 in
  # kernels/results/quantized_steps/nvidia-h200/); int8 through XLA's dot. The 8B pair first
  # (there the weights' bytes dominate a step), then the exactness tests of the quantized and
  # parallel-drafter paths on this backend, then the 1.5B (a fresh machine compiles its chain
  # for ~40 s).
  if [ -n "${DRY:-}" ]; then
    PAIRS=(--target "$DRY_TARGET" --draft "$DRY_DRAFT")
    SMALL=("${PAIRS[@]}")
    QSTEPS=(--context 16 --max-len 96 --steps 2 --repeats 1)
    QEXACT=(--dtypes float32 --files tests/decoding/test_int4.py -k "exactly")
  else
    PAIRS=(--pair llama-3.1-8b)
    SMALL=(--pair qwen2.5-coder)
    QSTEPS=(--steps 8 --repeats 3)
    QEXACT=(--dtypes float32 --workers 12 --files tests/kernels/test_grouped_int4.py
            tests/kernels/test_grouped_int4_gpu.py tests/decoding/test_int4.py
            tests/decoding/test_weight_dtypes.py tests/decoding/test_dflash_decoding.py
            tests/decoding/test_gguf_blocks_decoding.py -k "not mesh and not split and not tpu")
  fi
  q8b() {  # q8b NAME [ENV=VALUE] [step_programs.py options]: the 8B pair's plain and chain steps
    local name=$1; shift
    step "steps_8b_$name" "${Q8B_S:-80}" env "$@" --dtype bfloat16 --methods ar chain_g3 \
      "${QSTEPS[@]}" --out "$W/steps_8b_$name"
  }
  q8b bf16 python3 kernels/step_programs.py "${PAIRS[@]}"
  q8b int4 python3 kernels/step_programs.py "${PAIRS[@]}" --weights int4
  q8b int4_xla VOCABJAX_GPU_INT4_KERNEL=0 python3 kernels/step_programs.py "${PAIRS[@]}" \
    --weights int4
  step exactness_quant "${QEXACT_S:-150}" python3 eval/gpu_exactness.py \
    --out "$W/exactness_quant" --limit-s "${QEXACT_EACH_S:-120}" "${QEXACT[@]}"
  q8b int8 python3 kernels/step_programs.py "${PAIRS[@]}" --weights int8
  for w in bf16 int4; do
    step "steps_1.5b_$w" "${Q15_S:-90}" python3 kernels/step_programs.py "${SMALL[@]}" \
      --dtype bfloat16 $([ "$w" = bf16 ] || echo --weights $w) --methods ar chain_g3 \
      "${QSTEPS[@]}" --out "$W/steps_1.5b_$w"
  done
elif [ "$SET" = first ]; then
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
  # Whole steps of each method as the decoders compile them (kernels/step_programs.py) on the
  # real pair's shapes, bf16, with the eagle_gate run's tau for projections.
  step steps_qwen "${STEPS_S:-130}" python3 kernels/step_programs.py --pair qwen2.5-coder \
    --dtype bfloat16 --steps 6 --repeats 3 --run eval/results/eagle/gate --out "$W/steps_qwen"
  # Does the per-row (vmapped) path move copy the cache here, as on XLA:CPU? (f32, 1.5B)
  step compact_path "${COMPACT_S:-80}" python3 kernels/compact_path.py --repeats 3 --steps 6 \
    --out "$W/compact_path.md"
  # The kernel with software pipelining (num_stages) in the tuning grid, k >= 2048.
  step kernel_stages "${KERNEL_S:-150}" python3 kernels/bench_indexed_lm_head.py \
    --out "$W/kernel_stages" --ks 2048 8192 --repeats 10 --tune-block-k 64 128 \
    --tune-block-d 128 256 --tune-num-warps 4 8 --tune-num-stages 1 3
  # The 8B pair's whole steps: an EAGLE-3 head of Llama-3.1-8B's published size (intermediate
  # 14336, Vd = 32000).
  step steps_llama "${STEPS8_S:-110}" python3 kernels/step_programs.py --pair llama-3.1-8b \
    --dtype bfloat16 --steps 6 --repeats 3 --head-intermediate 14336 --head-vocab 32000 \
    --run eval/results/eagle/gate --out "$W/steps_llama"
  # The Qwen2.5-7B pair's programs (never measured), fewer heads.
  step bench_qwen7b "${QWEN7_S:-100}" python3 -m vocabjax.bench --pair qwen2.5-7b \
    --dtypes bfloat16 --batch 1 --heads full trim:32768 specvocab:512 specvocab:2048 \
    --head-rows 1 4 --no-progress --out "$W/bench"
fi
ls -lR "$W" | head -40
