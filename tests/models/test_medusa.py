"""Medusa heads against a PyTorch transcription of Medusa's ResBlock heads, their checkpoint
layout (safetensors and Medusa's own .pt), and the static tree of Medusa choices."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.medusa import load_medusa, save_medusa
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.identity import drafter_identity
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.models.medusa import (MedusaConfig, MedusaError, init_medusa, medusa_logits,
                                    medusa_tree)

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=96, hidden_size=32, intermediate_size=64,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


class ResBlock(nn.Module):  # Medusa's (medusa/model/medusa_model.py)
  def __init__(self, hidden_size):
    super().__init__()
    self.linear = nn.Linear(hidden_size, hidden_size)
    torch.nn.init.zeros_(self.linear.weight)
    self.act = nn.SiLU()

  def forward(self, x):
    return x + self.act(self.linear(x))


def torch_heads(num_heads, num_layers, hidden, vocab, lm_head):
  """Medusa's `medusa_head`: per head one ResBlock repeated, then a Linear from the LM head."""
  heads = nn.ModuleList([nn.Sequential(*([ResBlock(hidden)] * num_layers),
                                       nn.Linear(hidden, vocab, bias=False))
                         for _ in range(num_heads)])
  for i in range(num_heads):
    heads[i][-1].weight.data[:] = torch.from_numpy(np.asarray(lm_head))
  return heads


@pytest.fixture(scope="module")
def target():
  return init_params(jax.random.key(0), CFG, scale=0.5)


def _trained_like(params, seed=1):
  """Medusa's initial W is zero; give the blocks weights so the test sees them."""
  rs = np.random.RandomState(seed)
  for head in params["heads"]:
    head["w"] = jnp.asarray(rs.randn(*head["w"].shape) * 0.2, jnp.float32)
  return params


@pytest.mark.parametrize("num_layers", [1, 2])
def test_heads_match_medusas_pytorch_heads(target, tmp_path, num_layers, monkeypatch):
  U = lm_head_weight(target, CFG)
  mc = MedusaConfig(num_heads=3, hidden_size=32, vocab_size=96, num_layers=num_layers)
  params = _trained_like(init_medusa(jax.random.key(2), mc, U))
  heads = torch_heads(3, num_layers, 32, 96, U)
  for i, head in enumerate(params["heads"]):  # the same weights into Medusa's modules
    heads[i][0].linear.weight.data[:] = torch.from_numpy(np.asarray(head["w"]))
    heads[i][0].linear.bias.data[:] = torch.from_numpy(np.asarray(head["b"]))
  h = np.random.RandomState(3).randn(5, 32).astype(np.float32)
  ours = np.asarray(medusa_logits(params, jnp.asarray(h), config=mc))  # [5, 3, 96]
  with torch.no_grad():
    ref = torch.stack([heads[i](torch.from_numpy(h)) for i in range(3)], dim=1).numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4)
  # Medusa's own checkpoint: torch.save(medusa_head.state_dict()) beside its config.json
  d = tmp_path / f"pt{num_layers}"
  d.mkdir()
  torch.save(heads.state_dict(), d / "medusa_lm_head.pt")
  (d / "config.json").write_text(json.dumps({"medusa_num_heads": 3,
                                             "medusa_num_layers": num_layers}))
  monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
  with pytest.raises(CheckpointError, match=r"only pickled PyTorch weights \(medusa_lm_head.pt\)"):
    load_medusa(d, target_config=CFG)
  assert load_medusa(d, target_config=CFG, allow_bin=True)[0] == mc  # the Python API alone
  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "1")
  mc2, p2, _ = load_medusa(d, target_config=CFG)
  assert mc2 == mc
  np.testing.assert_allclose(np.asarray(medusa_logits(p2, jnp.asarray(h), config=mc2)), ref,
                             atol=1e-4)


def test_initial_heads_are_the_targets_head_and_shared_head(target):
  U = lm_head_weight(target, CFG)
  mc = MedusaConfig(num_heads=2, hidden_size=32, vocab_size=96)
  p = init_medusa(jax.random.key(0), mc, U)
  h = jnp.asarray(np.random.RandomState(0).randn(4, 32), jnp.float32)
  out = medusa_logits(p, h, config=mc)
  # W = 0: each head is the target's head applied to h + silu(b)
  want = (h + jax.nn.silu(p["heads"][1]["b"])) @ U.T
  np.testing.assert_allclose(np.asarray(out[:, 1]), np.asarray(want), atol=1e-4)
  shared = MedusaConfig(num_heads=2, hidden_size=32, vocab_size=96, shared_lm_head=True)
  ps = init_medusa(jax.random.key(0), shared)
  assert "lm_head" not in ps["heads"][0]
  np.testing.assert_allclose(np.asarray(medusa_logits(ps, h, config=shared, lm_head=U)),
                             np.asarray(out), atol=1e-4)
  with pytest.raises(MedusaError, match="pass the target's LM head"):
    medusa_logits(ps, h, config=shared)


def test_save_load_roundtrip_and_bad_checkpoints(target, tmp_path):
  U = lm_head_weight(target, CFG)
  mc = MedusaConfig(num_heads=2, hidden_size=32, vocab_size=96, num_layers=2)
  params = _trained_like(init_medusa(jax.random.key(1), mc, U))
  ident = {"source": "tiny", **drafter_identity(target, CFG)}
  save_medusa(params, mc, tmp_path / "m", target=ident)
  mc2, p2, rec = load_medusa(tmp_path / "m", target_config=CFG, target_params=target)
  assert mc2 == mc and rec["fingerprint"] == ident["fingerprint"]
  h = jnp.ones((2, 32))
  np.testing.assert_array_equal(np.asarray(medusa_logits(p2, h, config=mc)),
                                np.asarray(medusa_logits(params, h, config=mc)))
  other = init_params(jax.random.key(9), CFG, scale=0.5)
  with pytest.raises(CheckpointError, match="trained for another target"):
    load_medusa(tmp_path / "m", target_config=CFG, target_params=other)
  wide = dataclasses.replace(CFG, vocab_size=128)
  with pytest.raises(CheckpointError, match=r"'0.2.weight' has shape \(96, 32\).*\(128, 32\)"):
    load_medusa(tmp_path / "m", target_config=wide)
  # config counts that are not integers, and tensors the config has no place for
  import json
  import shutil

  from safetensors.numpy import load_file, save_file
  raw = json.loads((tmp_path / "m" / "config.json").read_text())
  for key, value in [("medusa_num_heads", "2"), ("medusa_num_heads", 2.5),
                     ("medusa_num_heads", True), ("medusa_num_layers", -1),
                     ("medusa_num_layers", "2")]:
    shutil.copytree(tmp_path / "m", tmp_path / "c", dirs_exist_ok=True)
    (tmp_path / "c" / "config.json").write_text(json.dumps({**raw, key: value}))
    with pytest.raises(CheckpointError, match=f"{key}={value!r} must be an integer"):
      load_medusa(tmp_path / "c", target_config=CFG)
  (tmp_path / "c" / "config.json").write_text(json.dumps({**raw, "medusa_num_layers": 1}))
  with pytest.raises(CheckpointError, match=r"missing tensor '0.1.weight'"):
    load_medusa(tmp_path / "c", target_config=CFG)  # its head's rows sit after 2 blocks
  (tmp_path / "c" / "config.json").write_text(json.dumps({**raw, "medusa_num_layers": 0}))
  with pytest.raises(CheckpointError, match=r"missing tensor '0.0.weight'"):
    load_medusa(tmp_path / "c", target_config=CFG)  # no blocks: its rows sought at block 0
  sd = load_file(str(tmp_path / "m" / "medusa_lm_head.safetensors"))
  save_file({**sd, "1.7.extra": np.zeros(3, np.float32)},
            str(tmp_path / "c" / "medusa_lm_head.safetensors"))
  (tmp_path / "c" / "config.json").write_text(json.dumps(raw))
  with pytest.raises(CheckpointError, match="tensor '1.7.extra' has no place"):
    load_medusa(tmp_path / "c", target_config=CFG)
  # a missing tensor, a truncated file, a directory without heads
  del sd["1.0.linear.bias"]
  save_file(sd, str(tmp_path / "m" / "medusa_lm_head.safetensors"))
  with pytest.raises(CheckpointError, match="missing tensor '1.0.linear.bias'"):
    load_medusa(tmp_path / "m", target_config=CFG)
  f = tmp_path / "m" / "medusa_lm_head.safetensors"
  f.write_bytes(f.read_bytes()[:100])
  with pytest.raises(CheckpointError, match="not a readable safetensors file"):
    load_medusa(tmp_path / "m", target_config=CFG)
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "config.json").write_text('{"medusa_num_heads": 2}')
  with pytest.raises(CheckpointError, match="holds no Medusa heads"):
    load_medusa(tmp_path / "empty", target_config=CFG)


def medusa_buffers_mask(choices):
  """Medusa's `generate_medusa_buffers` attention mask, transcribed (numpy)."""
  s = sorted(choices, key=lambda x: (len(x), x))
  m = np.eye(len(s) + 1, dtype=bool)
  m[:, 0] = True
  for j, c in enumerate(s):
    for k in range(len(c) - 1):
      m[j + 1, s.index(c[:k + 1]) + 1] = True
  return m


def test_tree_of_medusa_choices():
  choices = [[0, 0, 0], [1], [0], [0, 1], [1, 0], [0, 0], [2]]
  t = medusa_tree(choices, num_heads=3)
  # Medusa's order: (0) (1) (2) (0,0) (0,1) (1,0) (0,0,0)
  assert t.choices == ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
  assert t.parent.tolist() == [0, 0, 0, 1, 1, 2, 4]
  assert t.depth.tolist() == [1, 1, 1, 2, 2, 2, 3] and t.head.tolist() == [0, 0, 0, 1, 1, 1, 2]
  assert t.rank.tolist() == [0, 1, 2, 0, 1, 0, 0]
  assert (t.size, t.max_depth, t.top_k, t.max_children) == (7, 3, 3, 3)
  np.testing.assert_array_equal(t.attention_mask(), medusa_buffers_mask(choices))


@pytest.mark.parametrize("choices,heads,message", [
    ([], 2, "empty Medusa choices"),
    ([[0], [0]], 2, r"repeat \[\[0\]\]"),
    ([[0], [0, 0], [0, 0, 0]], 2, r"\[0, 0, 0\] is 3 deep but there are 2 heads"),
    ([[0], [1, 0]], 2, r"\[1, 0\] has no parent \[1\]"),
    ([[0], [-1]], 2, r"\[-1\]: a path of top-k ranks >= 0"),
])
def test_bad_trees(choices, heads, message):
  with pytest.raises(MedusaError, match=message):
    medusa_tree(choices, num_heads=heads)
