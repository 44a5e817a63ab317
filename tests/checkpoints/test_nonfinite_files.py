"""Every weight file vocabjax loads is checked for NaN / inf, named by tensor, as models are: an
EAGLE-3 and an EAGLE-1/2 head, Medusa heads, a ranker, a distilled drafter (its LoRA adapters)
and its acceptance head (before: such files loaded and ran, and speculation silently stopped
paying)."""

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.loader import load_model


@pytest.fixture(scope="module")
def target(tiny_chat_dir):
  return load_model(tiny_chat_dir, dtype="float32")


def _poison(f, name, value=np.nan, at=(0,)):
  t = load_file(str(f))
  a = t[name].copy()
  a[at] = value
  t[name] = a
  save_file(t, str(f))


def test_eagle3_head(target, tmp_path):
  from vocabjax.checkpoints.eagle3 import load_eagle3, save_eagle3
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config

  hc = head_config(target.config, (0, 1), 40)
  p = init_eagle(jax.random.key(0), hc, scale=0.2)
  d = save_eagle3(p, hc, tmp_path / "h")
  _poison(d / "model.safetensors", "midlayer.mlp.up_proj.weight", np.inf, (3, 4))
  with pytest.raises(CheckpointError, match=r"tensor \['layer'\]\['w_up'\] .* holds 1 non-finite"):
    load_eagle3(d, target_config=target.config)


def test_eagle2_head(target, tmp_path):
  from tests.helpers.heads import eagle2_config, eagle2_params
  from vocabjax.checkpoints.eagle2 import load_eagle2, save_eagle2

  hc = eagle2_config(target.config)
  d = save_eagle2(eagle2_params(hc), hc, tmp_path / "h")
  _poison(d / "model.safetensors", "fc.bias")
  with pytest.raises(CheckpointError, match=r"tensor \['input_fc_bias'\] .* non-finite"):
    load_eagle2(d, target_config=target.config)


def test_medusa_heads(target, tiny_medusa_dir, tmp_path):
  import shutil

  from vocabjax.checkpoints.medusa import load_medusa

  d = tmp_path / "m"
  shutil.copytree(tiny_medusa_dir, d)
  _poison(d / "medusa_lm_head.safetensors", "1.0.linear.bias")
  with pytest.raises(CheckpointError, match=r"tensor \['heads'\]\[1\]\['b'\] .* non-finite"):
    load_medusa(d, target_config=target.config)


def test_ranker(target, tmp_path):
  from vocabjax.vocab.ranked import Ranker, RankerError, svd_ranker

  f = svd_ranker(target.params, target.config, rank=4).save(tmp_path / "r.safetensors")
  t = load_file(str(f))
  from safetensors import safe_open

  with safe_open(str(f), framework="numpy") as h:
    md = h.metadata()
  t["vocab"][5, 1] = np.nan
  save_file(t, str(f), metadata=md)
  with pytest.raises(RankerError, match=r"tensor \['vocab'\] .* non-finite"):
    Ranker.load(f)


def test_distilled_drafter_lora(target, tmp_path):
  from vocabjax.checkpoints.distilled import load_distilled, save_distilled
  from vocabjax.models.identity import drafter_identity
  from vocabjax.models.lora import init_lora

  lora = init_lora(jax.random.key(0), target.params, rank=2)
  d = tmp_path / "drafter"
  save_distilled(d, lora, None, {"mode": "lora", "lora_rank": 2, "lora_alpha": 4.0,
                                 "base": drafter_identity(target.params, target.config)})
  name = next(k for k in load_file(str(d / "drafter.safetensors")))
  _poison(d / "drafter.safetensors", name)
  with pytest.raises(CheckpointError, match="drafter.safetensors: tensor .* non-finite"):
    load_distilled(d, target.params, target.config)
