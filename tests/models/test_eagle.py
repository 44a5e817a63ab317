"""EAGLE-3 head: forward against a PyTorch transcription of SGLang's
`LlamaForCausalLMEagle3` layer, EAGLE-3 checkpoint round trip, target mismatch errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.eagle3 import load_eagle3, save_eagle3
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import (EagleConfig, draft_to_target, eagle_forward, eagle_logits,
                                   init_eagle)

LAYER = LlamaLikeConfig(arch="llama", vocab_size=50, hidden_size=32, intermediate_size=40,
                        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
CFG = EagleConfig(layer=LAYER, target_hidden_size=32, feature_layers=(1, 3, 5),
                  draft_vocab_size=20)


def _params(seed=0):
  p = init_eagle(jax.random.key(seed), CFG, scale=0.2)
  rs = np.random.RandomState(seed)
  for k in ("attn_norm", "hidden_norm", "mlp_norm"):  # non-trivial norms
    p["layer"][k] = jnp.asarray(1 + 0.1 * rs.randn(32), jnp.float32)
  p["d2t"] = jnp.asarray(np.sort(rs.choice(50, 20, replace=False)) - np.arange(20), jnp.int32)
  return p


def _torch_reference(p, embed, tokens, feats):
  """SGLang's EAGLE-3 midlayer + norm + lm_head, written out in torch (T tokens, no cache)."""
  t = {k: torch.tensor(np.asarray(v), dtype=torch.float64) for k, v in p["layer"].items()}
  eps, H, KV, hd = LAYER.rms_norm_eps, 4, 2, 8

  def rms(x, w):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

  e = torch.tensor(np.asarray(embed), dtype=torch.float64)[torch.tensor(tokens)]
  h = torch.tensor(feats, dtype=torch.float64) @ torch.tensor(np.asarray(p["fc"]),
                                                               dtype=torch.float64).T
  residual = h
  x = torch.cat([rms(e, t["attn_norm"]), rms(h, t["hidden_norm"])], -1)
  T = x.shape[0]
  q = (x @ t["wq"].T).view(T, H, hd).transpose(0, 1)
  k = (x @ t["wk"].T).view(T, KV, hd).transpose(0, 1)
  v = (x @ t["wv"].T).view(T, KV, hd).transpose(0, 1)
  inv = 1.0 / (LAYER.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
  ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
  cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

  def rope(z):
    z1, z2 = z[..., :hd // 2], z[..., hd // 2:]
    return z * cos + torch.cat([-z2, z1], -1) * sin

  q, k = rope(q), rope(k)
  k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
  s = q @ k.transpose(-1, -2) / hd ** 0.5
  s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
  a = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, H * hd)
  x = residual + a @ t["wo"].T
  y = rms(x, t["mlp_norm"])
  x = x + (torch.nn.functional.silu(y @ t["w_gate"].T) * (y @ t["w_up"].T)) @ t["w_down"].T
  fn = torch.tensor(np.asarray(p["final_norm"]), dtype=torch.float64)
  lm = torch.tensor(np.asarray(p["lm_head"]), dtype=torch.float64)
  return x.numpy(), (rms(x, fn) @ lm.T).numpy()


def test_forward_matches_the_sglang_layer_in_torch():
  p = _params()
  rs = np.random.RandomState(1)
  embed = jnp.asarray(rs.randn(50, 32) * 0.5, jnp.float32)
  tokens = np.array([3, 17, 8, 42, 0, 9])
  feats = rs.randn(6, 96).astype(np.float32)  # 3 target layers x Dt = 32
  T = len(tokens)
  h = jnp.einsum("BTF,DF->BTD", jnp.asarray(feats)[None], p["fc"])
  x, cache = eagle_forward(p, embed, jnp.asarray(tokens)[None], h, jnp.arange(T)[None],
                           KVCache.init(LAYER, 1, 8), config=CFG)
  logits = eagle_logits(p, x, config=CFG)
  want_x, want_logits = _torch_reference(p, embed, tokens, feats)
  np.testing.assert_allclose(np.asarray(x[0]), want_x, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(np.asarray(logits[0]), want_logits, rtol=2e-4, atol=2e-4)
  assert int(cache.lengths[0]) == T
  # the head's ids map into the target vocabulary through d2t
  ids = jnp.arange(20)
  np.testing.assert_array_equal(np.asarray(draft_to_target(p, ids)),
                                np.asarray(ids + p["d2t"]))


@pytest.mark.parametrize("rope", [
    dict(rope_type="llama3", rope_theta=500000.0, rope_factor=8.0, rope_low_freq_factor=1.0,
         rope_high_freq_factor=4.0, rope_original_max_position=8192),
    dict(rope_type="linear", rope_theta=1e6, rope_factor=8.0),  # Gemma 3 4B's global RoPE
    dict(rope_type="yarn", rope_factor=4.0, rope_original_max_position=32768,
         rope_attention_factor=1.1386),
    dict(rope_freq_factors=tuple(1.0 + 0.5 * i for i in range(4)))],  # a Llama 3.1 GGUF's
    ids=["llama3", "linear", "yarn", "gguf-freq-factors"])
def test_a_heads_rope_scaling_survives_its_checkpoint(tmp_path, rope):
  """The head's layer RoPE (its target's: `train.eagle_step.head_config`) is written as config.json
  spells it and read back: before, only rope_theta was, and a head trained for a Llama 3.1
  target came back with plain RoPE (other positions' angles, other drafts)."""
  cfg = CFG.__class__(layer=LAYER.replace(**rope), target_hidden_size=32,
                      feature_layers=(1, 3, 5), draft_vocab_size=20)
  save_eagle3(_params(), cfg, tmp_path / "head")
  back, _, _ = load_eagle3(tmp_path / "head")
  assert back == cfg
  np.testing.assert_array_equal(back.layer.inv_freq(), cfg.layer.inv_freq())


def test_a_published_heads_config_reads_its_rope_scaling(tmp_path):
  """EAGLE-3's own head for Llama 3.1 8B writes its llama3 `rope_scaling` with transformers'
  other fields (bos/eos ids, torch_dtype, ...): the layer gets that scaling."""
  import json

  save_eagle3(_params(), CFG, tmp_path / "head")
  path = tmp_path / "head" / "config.json"
  raw = json.loads(path.read_text())
  raw.update(rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001,
             torch_dtype="float16", transformers_version="4.28.1", use_cache=True,
             rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                           "original_max_position_embeddings": 8192, "rope_type": "llama3"})
  path.write_text(json.dumps(raw))
  layer = load_eagle3(tmp_path / "head")[0].layer
  assert (layer.rope_type, layer.rope_factor, layer.rope_theta) == ("llama3", 8.0, 500000.0)
  raw["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
  path.write_text(json.dumps(raw))
  with pytest.raises(CheckpointError, match=r"config.json: .*rope_type='dynamic'"):
    load_eagle3(tmp_path / "head")


def test_eagle3_checkpoint_round_trip_is_exact(tmp_path):
  p = _params(3)
  target = {"source": "tiny", "fingerprint": "abc"}
  save_eagle3(p, CFG, tmp_path / "head", target=target)
  cfg, back, rec = load_eagle3(tmp_path / "head")
  assert cfg == CFG and rec == target
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(back)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # without the head's own LM head (a head drafting through the target's): the same other
  # tensors, no "lm_head" read
  _, no_head, _ = load_eagle3(tmp_path / "head", lm_head=False)
  assert set(no_head) == set(back) - {"lm_head"}
  for a, b in zip(jax.tree.leaves(no_head), jax.tree.leaves({k: v for k, v in back.items()
                                                             if k != "lm_head"})):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  from safetensors.numpy import load_file

  t = load_file(str(tmp_path / "head" / "model.safetensors"))
  assert t["d2t"].dtype == np.int64 and t["t2d"].dtype == bool and t["t2d"].sum() == 20
  np.testing.assert_array_equal(np.flatnonzero(t["t2d"]), np.arange(20) + t["d2t"])


def test_head_for_another_target_is_refused(tmp_path):
  save_eagle3(_params(), CFG, tmp_path / "head")
  ok = LlamaLikeConfig(arch="qwen2", vocab_size=50, hidden_size=32, intermediate_size=32,
                       num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8)
  load_eagle3(tmp_path / "head", target_config=ok)
  for change, match in [({"hidden_size": 48}, "features of width 32, the target's hidden size "
                         "is 48"),
                        ({"vocab_size": 51}, "vocabulary of 50 tokens, the target has V=51"),
                        ({"num_layers": 5}, r"layers \(1, 3, 5\), the target has 5 layers")]:
    bad = LlamaLikeConfig(**{**ok.__dict__, **change})
    with pytest.raises(ValueError, match=match):
      load_eagle3(tmp_path / "head", target_config=bad)


def test_corrupt_or_incomplete_heads(tmp_path):
  from safetensors.numpy import load_file, save_file

  save_eagle3(_params(), CFG, tmp_path / "head")
  f = tmp_path / "head" / "model.safetensors"
  t = load_file(str(f))
  del t["midlayer.hidden_norm.weight"]
  save_file(t, str(f))
  with pytest.raises(CheckpointError, match="midlayer.hidden_norm.weight is missing"):
    load_eagle3(tmp_path / "head")
  save_eagle3(_params(), CFG, tmp_path / "head")
  t = load_file(str(f))
  t["lm_head.weight"] = t["lm_head.weight"][:-1]
  save_file(t, str(f))
  for read in (True, False):  # the LM head's shape is checked even when it is not read
    with pytest.raises(CheckpointError, match=r"lm_head.weight has shape \(19, "):
      load_eagle3(tmp_path / "head", lm_head=read)
  data = f.read_bytes()
  f.write_bytes(data[:len(data) // 2])  # truncated
  with pytest.raises(CheckpointError, match="not a readable EAGLE-3 head"):
    load_eagle3(tmp_path / "head", lm_head=False)
  f.write_bytes(b"junk")
  with pytest.raises(CheckpointError, match="not a readable EAGLE-3 head"):
    load_eagle3(tmp_path / "head")
  with pytest.raises(ValueError, match="draft_vocab_size=51 must be in"):
    EagleConfig(layer=LAYER, target_hidden_size=24, feature_layers=(1,), draft_vocab_size=51)


def _authors_layout(src, dst, *, prefix="midlayer.", drop_ids=True, fmt="bin", extra=None,
                    drop=()):
  """`src` (a head vocabjax saved) rewritten as published: the authors' pytorch_model.bin
  (midlayer.*) or SGLang's safetensors (layers.0.*), a config naming no fused layers and no
  target_hidden_size, no vocabjax entry."""
  import json

  from safetensors.numpy import load_file, save_file

  dst.mkdir()
  cfg = json.loads((src / "config.json").read_text())
  for k in ["vocabjax", "target_hidden_size"] + (["eagle_config"] if drop_ids else []):
    cfg.pop(k, None)
  (dst / "config.json").write_text(json.dumps(cfg))
  t = {(prefix + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
       for k, v in load_file(str(src / "model.safetensors")).items() if k not in drop}
  t.update(extra or {})
  if fmt == "bin":
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()},
               dst / "pytorch_model.bin")
  else:
    save_file(t, str(dst / "model.safetensors"))
  return dst


def test_heads_in_the_published_layouts_load_as_the_same_head(tmp_path, monkeypatch):
  """The EAGLE authors' pytorch_model.bin (refused until pickles are allowed) and SGLang's
  layers.0.* safetensors, each with a config naming no fused layers (the authors' default
  1, L/2 - 1, L - 4 of the target), load as the head vocabjax saved."""
  p = _params(4)
  cfg6 = EagleConfig(layer=LAYER, target_hidden_size=32, feature_layers=(1, 2, 2),
                     draft_vocab_size=20)  # what the authors' code reads of a 6-layer target
  save_eagle3(p, cfg6, tmp_path / "ours")
  target = LlamaLikeConfig(arch="llama", vocab_size=50, hidden_size=32, intermediate_size=32,
                           num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8)
  monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
  authors = _authors_layout(tmp_path / "ours", tmp_path / "authors")
  with pytest.raises(CheckpointError, match=r"only pickled PyTorch weights \(pytorch_model.bin\)"):
    load_eagle3(authors, target_config=target)
  assert load_eagle3(authors, target_config=target, allow_bin=True)[0] == cfg6  # the API alone
  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "1")
  sglang = _authors_layout(tmp_path / "ours", tmp_path / "sglang", prefix="layers.0.",
                           fmt="safetensors")
  for d in (authors, sglang):
    cfg, back, _ = load_eagle3(d, target_config=target)
    assert cfg == cfg6, d
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(back)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(CheckpointError, match="names no fused target layers"):
    load_eagle3(authors)  # the default needs the target's layer count


def test_published_heads_options_it_does_not_implement_are_refused_by_name(tmp_path,
                                                                           monkeypatch):
  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "1")
  save_eagle3(_params(), CFG, tmp_path / "ours")
  target = LlamaLikeConfig(arch="llama", vocab_size=50, hidden_size=32, intermediate_size=32,
                           num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8)
  d = _authors_layout(tmp_path / "ours", tmp_path / "fcnorm", drop_ids=False,
                      extra={"fc_norm.0.weight": np.ones(32, np.float32),
                             "fc.bias": np.zeros(32, np.float32)})
  with pytest.raises(CheckpointError, match=r"tensor\(s\) \['fc.bias', 'fc_norm.0.weight'\] are "
                     "not part of the EAGLE-3 head"):
    load_eagle3(d, target_config=target)
  # a head carrying an embedding that is not the target's is refused; the target's passes
  rs = np.random.RandomState(0)
  embed = rs.randn(50, 32).astype(np.float32)
  d = _authors_layout(tmp_path / "ours", tmp_path / "embed", drop_ids=False,
                      extra={"embed_tokens.weight": embed})
  load_eagle3(d, target_config=target, target_params={"embed": embed})
  with pytest.raises(CheckpointError, match="carries its own token embedding"):
    load_eagle3(d, target_config=target, target_params={"embed": embed + 1})


def test_a_full_vocabulary_head_without_d2t_drafts_the_whole_vocabulary(tmp_path):
  full = EagleConfig(layer=LAYER, target_hidden_size=32, feature_layers=(1, 3, 5),
                     draft_vocab_size=50)
  p = init_eagle(jax.random.key(2), full, scale=0.2)
  p["d2t"] = jnp.zeros(50, jnp.int32)
  save_eagle3(p, full, tmp_path / "ours")
  d = _authors_layout(tmp_path / "ours", tmp_path / "nod2t", drop_ids=False, fmt="safetensors",
                      drop=("d2t", "t2d"))
  cfg, back, _ = load_eagle3(d)
  np.testing.assert_array_equal(np.asarray(back["d2t"]), np.zeros(50))
  # a smaller vocabulary without its map is an error naming the tensor
  save_eagle3(_params(), CFG, tmp_path / "small")
  d = _authors_layout(tmp_path / "small", tmp_path / "small-nod2t", drop_ids=False,
                      fmt="safetensors", drop=("d2t",))
  with pytest.raises(CheckpointError, match="tensor d2t is missing"):
    load_eagle3(d)
