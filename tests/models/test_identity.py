"""A drafter's identity (`models.identity`): the exact fingerprint of its LM head, and the sketch
that lets a file made for a drafter (a SpecVocab ranker, a DynaSpec router) be used with the
same drafter quantized at load, while another model is still refused by name."""

import jax
import numpy as np
import pytest

from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.identity import (SKETCH_TOLERANCE, drafter_identity, identity_mismatch,
                                      sketch_distance)
from vocabjax.models.llamalike import cast_weights, quantize_blocks, quantize_grouped
from vocabjax.vocab import Ranker, RankerError

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96,
                      num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def drafters():
  base = init_params(jax.random.key(0), CFG, scale=0.3)
  return base, init_params(jax.random.key(1), CFG, scale=0.3)


def test_quantized_copies_fit_and_another_model_does_not(drafters):
  base, other = drafters
  want = drafter_identity(base, CFG)
  assert len(want["sketch"]) == 128 * 4
  for name, copy in (("bf16", cast_weights(base, "bfloat16")), ("int8", cast_weights(base, "int8")),
                     ("Q4_0", quantize_blocks(base)), ("Q8_0", quantize_blocks(base, "Q8_0")),
                     ("grouped int4", quantize_grouped(base))):
    got = drafter_identity(copy, CFG)
    assert sketch_distance(got["sketch"], want["sketch"]) < SKETCH_TOLERANCE / 2, name
    assert identity_mismatch(want, copy, CFG, "the ranker was trained") is None, name
  assert drafter_identity(cast_weights(base, "bfloat16"), CFG)["fingerprint"] == want["fingerprint"]
  assert drafter_identity(quantize_blocks(base), CFG)["fingerprint"] != want["fingerprint"]
  why = identity_mismatch(want, other, CFG, "the ranker was trained")
  assert why.startswith("the ranker was trained for another drafter (LM-head fingerprint "), why
  assert f"over the {SKETCH_TOLERANCE} a quantized copy" in why, why


def test_files_without_a_sketch_and_exact_checks_need_the_same_head(drafters):
  base, _ = drafters
  want = drafter_identity(base, CFG)
  old = {k: v for k, v in want.items() if k != "sketch"}  # a file made before sketches
  assert identity_mismatch(old, base, CFG, "made") is None
  why = identity_mismatch(old, quantize_blocks(base), CFG, "the ranker was trained")
  assert "the file has no head sketch" in why and "load the drafter as it was loaded" in why
  why = identity_mismatch(want, quantize_blocks(base), CFG, "x was distilled", exact=True)
  assert why.startswith("x was distilled for another drafter (LM-head fingerprint"), why
  wide = {**want, "hidden_size": 32}
  assert identity_mismatch(wide, base, CFG, "made") == ("made for a drafter with hidden_size=32, "
                                                        "this drafter has hidden_size=64")


def test_a_ranker_for_a_drafter_fits_it_quantized(drafters, tmp_path):
  base, other = drafters
  rs = np.random.RandomState(0)
  ranker = Ranker(down=rs.randn(8, 64).astype(np.float32),
                  vocab=rs.randn(256, 8).astype(np.float32),
                  drafter=drafter_identity(base, CFG), meta={})
  ranker.save(tmp_path / "r.safetensors")
  loaded = Ranker.load(tmp_path / "r.safetensors")
  loaded.check_drafter(quantize_blocks(base), CFG)
  with pytest.raises(RankerError, match="the ranker was trained for another drafter"):
    loaded.check_drafter(other, CFG)
