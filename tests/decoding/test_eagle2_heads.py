"""EAGLE-1/2 heads (the `yuhuili/EAGLE-*` layout, kind "eagle2"): their files read as the
authors write them, the head's forward as EAGLE's cnets.py computes it (a PyTorch transcription
here; the reference package itself in tests/decoding/test_reference_heads.py), and EAGLE-2 tree
decoding with such a head over the target's own LM head exact under every vocabulary policy
(full head, a static subset, a ranker's candidates)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.eagle2 import head_kind, load_eagle2, load_head, save_eagle2
from vocabjax.checkpoints.loader import load_model
from vocabjax.models.cache import KVCache
from vocabjax.models.eagle import eagle_forward
from tests.helpers.heads import eagle2_config, eagle2_params


@pytest.fixture(scope="module")
def target(tiny_chat_dir):
  return load_model(tiny_chat_dir, dtype="float32")


def test_the_authors_files_read_back_exactly(target, tmp_path, monkeypatch):
  hc = eagle2_config(target.config, attention_bias=True)
  p = eagle2_params(hc, bias=True)
  monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
  d = save_eagle2(p, hc, tmp_path / "bin", pickled=True, embed=target.params["embed"])
  assert head_kind(d) == "eagle2"
  raw = json.loads((d / "config.json").read_text())
  assert raw["bias"] is True and raw["qkv_bias"] is True and "draft_vocab_size" not in raw
  with pytest.raises(CheckpointError, match=r"only pickled PyTorch weights"):
    load_eagle2(d, target_config=target.config)
  # allowed through the Python API alone, the environment unset
  assert load_head(d, target_config=target.config, allow_bin=True)[0] == hc
  with pytest.raises(CheckpointError, match=r"only pickled PyTorch weights"):
    load_head(d, target_config=target.config, allow_bin=False)
  # and through the method registry, as the refusal says (METHODS[name].make(allow_bin=True))
  from vocabjax.eval.config import ConfigError
  from vocabjax.methods import METHODS

  spec = {"head": str(d), "top_k": 2, "depth": 2, "total_tokens": 4}
  with pytest.raises((CheckpointError, ConfigError), match=r"allow_bin=True to load_model or "
                                                           r"METHODS\[name\].make"):
    METHODS["eagle"].make(target, None, spec)
  dec = METHODS["eagle"].make(target, None, spec, allow_bin=True)
  assert dec.generate([[1, 2, 3]], max_new_tokens=4).tokens
  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "1")
  cfg, back, _ = load_head(d, target_config=target.config, target_params=target.params)
  assert cfg == hc
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(back)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # the embedding the file carries must be the target's
  with pytest.raises(CheckpointError, match=r"embed_tokens.weight\), not the target's"):
    load_eagle2(d, target_config=target.config,
                target_params={"embed": np.asarray(target.params["embed"]) + 1})


@pytest.mark.parametrize("change,match", [
    ("drop_bias", r"tensor fc.bias is missing \(config.json's bias is not false\)"),
    ("input_norm", r"\['layers.0.input_layernorm.weight'\] are not part .* no input norm"),
    ("wide_q", r"layers.0.self_attn.q_proj.weight has shape"),
    ("two_layers", "num_hidden_layers=2"),
])
def test_files_of_another_layout_are_refused_by_name(target, tmp_path, change, match):
  from safetensors.numpy import load_file, save_file

  hc = eagle2_config(target.config, attention_bias=False)
  d = save_eagle2(eagle2_params(hc), hc, tmp_path / "h")
  t = load_file(str(d / "model.safetensors"))
  raw = json.loads((d / "config.json").read_text())
  D = hc.hidden_size
  if change == "drop_bias":
    del t["fc.bias"]
  elif change == "input_norm":
    t["layers.0.input_layernorm.weight"] = np.ones(D, np.float32)
  elif change == "wide_q":
    t["layers.0.self_attn.q_proj.weight"] = np.zeros((hc.layer.q_dim, 2 * D), np.float32)
  else:
    raw["num_hidden_layers"] = 2
  save_file(t, str(d / "model.safetensors"))
  (d / "config.json").write_text(json.dumps(raw))
  with pytest.raises(CheckpointError, match=match):
    load_eagle2(d, target_config=target.config)


def _torch_eagle2(p, hc, embed, tokens, feats):
  """EAGLE's cnets.py Model.forward written out in torch (float64, T tokens, no cache):
  fc(cat(embed, feature)), layer 0 with no input norm, no final norm."""
  c = hc.layer
  t = {k: torch.tensor(np.asarray(v), dtype=torch.float64) for k, v in p["layer"].items()}
  eps, H, KV, hd = c.rms_norm_eps, c.num_heads, c.num_kv_heads, c.head_dim

  def rms(x, w):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

  e = torch.tensor(np.asarray(embed), dtype=torch.float64)[torch.tensor(tokens)]
  f = torch.tensor(feats, dtype=torch.float64)
  h = torch.cat([e, f], -1) @ torch.tensor(np.asarray(p["input_fc"]), dtype=torch.float64).T
  if "input_fc_bias" in p:
    h = h + torch.tensor(np.asarray(p["input_fc_bias"]), dtype=torch.float64)
  T = h.shape[0]
  q, k, v = (h @ t[w].T + (t[b] if b in t else 0) for w, b in (("wq", "bq"), ("wk", "bk"),
                                                                 ("wv", "bv")))
  q, k, v = (z.view(T, n, hd).transpose(0, 1) for z, n in ((q, H), (k, KV), (v, KV)))
  inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
  ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
  cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

  def rope(z):
    return z * cos + torch.cat([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin

  q, k = rope(q), rope(k)
  k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
  s = (q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(
      torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
  x = h + (s.softmax(-1) @ v).transpose(0, 1).reshape(T, H * hd) @ t["wo"].T
  y = rms(x, t["mlp_norm"])
  return (x + (torch.nn.functional.silu(y @ t["w_gate"].T) * (y @ t["w_up"].T)) @ t["w_down"].T
          ).numpy()


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_forward_matches_eagles_cnets_in_torch(target, qkv_bias):
  hc = eagle2_config(target.config, attention_bias=qkv_bias)
  p = eagle2_params(hc, seed=2)
  rs = np.random.RandomState(3)
  tokens = np.array([5, 40, 7, 300, 12, 9, 77])
  feats = rs.randn(len(tokens), hc.hidden_size).astype(np.float32)
  T = len(tokens)
  x, _ = eagle_forward(p, target.params["embed"], jnp.asarray(tokens)[None],
                       jnp.asarray(feats)[None], jnp.arange(T)[None],
                       KVCache.init(hc.layer, 1, 16), config=hc)
  want = _torch_eagle2(p, hc, target.params["embed"], tokens, feats)
  np.testing.assert_allclose(np.asarray(x[0]), want, rtol=1e-4, atol=1e-4)


def test_eagle2_tree_decoding_is_exact_under_every_vocabulary_policy(target, tiny_chat_dir,
                                                                      tmp_path):
  """`--method eagle` with an EAGLE-1/2 head in the authors' layout: the full target head,
  lm_head=target (the same for such a head), a static subset of the target's head and a
  ranker's candidates all give plain decoding's tokens; the MBSU accounting sees the head's
  own fc over [embedding; feature]."""
  from vocabjax.calibrate.counts import tokenizer_identity
  from vocabjax.generate import main, parse_args
  from vocabjax.methods import METHODS
  from vocabjax.vocab.ranked import svd_ranker
  from vocabjax.vocab.subset import VocabSubset

  hc = eagle2_config(target.config, attention_bias=True)
  head = save_eagle2(eagle2_params(hc, seed=5), hc, tmp_path / "head")
  VocabSubset(np.arange(0, target.config.vocab_size, 2), target.config.vocab_size,
              tokenizer_id=tokenizer_identity(target.tokenizer)).save(tmp_path / "sub.npz")
  svd_ranker(target.params, target.config, rank=4).save(tmp_path / "r.safetensors")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--prompt",
          "The quick brown", "--max-new-tokens", "12", "--quiet"]
  ar = main(parse_args(base))
  eagle = ["--method", "eagle", "--set", f"head={head}", "--set", "top_k=3", "--set",
           "depth=3", "--set", "total_tokens=6"]
  for extra in ([], ["--set", "lm_head=target"], ["--set", f"subset={tmp_path / 'sub.npz'}"],
                ["--set", f"ranker={tmp_path / 'r.safetensors'}", "--set", "k=16"]):
    spec = main(parse_args(base + eagle + extra))
    assert spec["output_ids"] == ar["output_ids"], extra
    assert spec["speculative"]["tau"] >= 1
  params = METHODS["eagle"].parse({"head": str(head), "top_k": 3, "depth": 3,
                                   "total_tokens": 6}, "test")
  D, V = hc.hidden_size, target.config.vocab_size
  assert METHODS["eagle"].head_rows(params) == V
  assert METHODS["eagle"].drafter_params(params) == hc.num_params(V)
  assert hc.num_params(V) > 2 * D * D + V * D  # the fc over [embedding; feature] counted


def test_frspec_released_token_lists_restrict_an_eagle2_head_exactly(target, tiny_chat_dir,
                                                                     tmp_path, monkeypatch):
  """FR-Spec's setting: an EAGLE-2 head over the target's head restricted to FR-Spec's released
  frequency-ranked list (`freq_K.pt`: torch.save of a list of ids, most frequent first) gives
  plain decoding's tokens; the list is pickled (refused until allowed) and is checked against
  the target's vocabulary."""
  from vocabjax.generate import main, parse_args
  from vocabjax.vocab.subset import SubsetError, VocabSubset

  V = target.config.vocab_size
  ranked = [int(i) for i in np.random.RandomState(0).permutation(V)[:64]]
  torch.save(ranked, tmp_path / "freq_64.pt")
  monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
  with pytest.raises(SubsetError, match=r"only pickled PyTorch weights \(freq_64.pt\)"):
    VocabSubset.load(tmp_path / "freq_64.pt", vocab_size=V)
  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "1")
  sub = VocabSubset.load(tmp_path / "freq_64.pt", vocab_size=V)
  assert sub.size == 64 and list(sub.ids) == sorted(ranked)
  torch.save(torch.tensor(ranked), tmp_path / "tensor.pt")  # a tensor of ids reads the same
  assert list(VocabSubset.load(tmp_path / "tensor.pt", vocab_size=V).ids) == sorted(ranked)
  for bad, match in (([V + 5, 1], "do not fit the target's vocabulary"),
                     ([3, 3], "repeats ids"), ({"a": 1}, "list \\(or tensor\\) of token ids")):
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(SubsetError, match=match):
      VocabSubset.load(tmp_path / "bad.pt", vocab_size=V)
  hc = eagle2_config(target.config)
  head = save_eagle2(eagle2_params(hc, seed=9), hc, tmp_path / "head")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
          "--quiet"]
  ar = main(parse_args(base))
  spec = main(parse_args(base + ["--method", "eagle", "--set", f"head={head}", "--set",
                                 "top_k=3", "--set", "depth=3", "--set", "total_tokens=6",
                                 "--set", f"subset={tmp_path / 'freq_64.pt'}"]))
  assert spec["output_ids"] == ar["output_ids"]


def test_an_eagle2_head_on_a_mesh_gives_the_one_device_tokens(target, tmp_path):
  """On a (2, 4) mesh of virtual CPU devices (weights loaded straight onto it), EAGLE-2 tree
  decoding with an EAGLE-1/2 head gives plain decoding's tokens, row by row."""
  from vocabjax import sharding
  from vocabjax.decoding import Decoder
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.eagle import EagleProposer
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.sampling import SamplingParams

  if jax.device_count() < 8:
    pytest.fail("needs 8 devices: run via pytest (tests/conftest.py sets XLA_FLAGS)")
  hc = eagle2_config(target.config)
  p = eagle2_params(hc, seed=6)
  mesh = sharding.make_mesh(data=2, model=4)
  m = load_model(target.source, dtype="float32", mesh=mesh)
  prompts = [target.tokenizer(t)["input_ids"] for t in ("def add(a, b):", "The quick brown")]
  greedy = SamplingParams(temperature=0.0)
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=10,
                                                      sampling=greedy)
  dec = SpeculativeEngine(m.params, m.config,
                          EagleProposer(m.params, m.config, p, hc, tree=TreeParams(3, 3, 6)),
                          mesh=mesh)
  out = dec.generate(prompts, max_new_tokens=10, sampling=greedy)
  assert out.tokens == ar.tokens
