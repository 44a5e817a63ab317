"""vocabjax's drafter heads against their authors' reference implementations from PyPI, on the
same random weights in the published layouts (`vocabjax.testing.references`: `eagle-llm` 1.2.1,
`medusa-llm` 0.1, installed without dependencies; `python -m vocabjax.testing.references
install`). Float32 throughout; tolerances 1e-4 (absolute, logits of order 1-10).

- EAGLE-1/2 head (`eagle.model.cnets.Model`, which EAGLE-2 reuses): the layer's output and the
  logits through the target's LM head, in one call and in cached steps, and the head's own
  greedy drafting (each side feeding its output back as the next feature) on several prompts.
  EAGLE-2's dynamic tree is not in the PyPI release (only on GitHub), so the tree itself is
  checked against vocabjax's own exactness tests, not against the reference.
- Medusa-1 heads (`medusa.model.medusa_model.ResBlock` heads as `MedusaModel` builds them, the
  dense trees of `medusa.model.utils`): the heads' logits, the tree (attention mask, positions,
  which head and rank fills each node), the candidate tokens `generate_candidates` drafts, and
  the accepted length `evaluate_posterior` gives for the target's logits on the tree."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vocabjax.checkpoints.eagle2 import load_eagle2, save_eagle2
from vocabjax.checkpoints.loader import load_model
from vocabjax.models.cache import KVCache
from vocabjax.models.eagle import EagleConfig, eagle_forward, init_eagle
from vocabjax.models.llamalike import FINAL_NORMED, forward, lm_head_weight
from vocabjax.testing import references

PROMPTS = ["def add(a, b):\n    return", "The quick brown fox", "for i in range(10):",
           "Hello world! How are"]


@pytest.fixture(scope="module")
def target(tiny_chat_dir):
  return load_model(tiny_chat_dir, dtype="float32")


def _hidden(target, ids):
  """The target's final normed hidden states [T, D] of `ids` (what EAGLE-1/2 and Medusa read)."""
  T = len(ids)
  h, _ = forward(target.params, jnp.asarray(ids)[None], jnp.arange(T)[None],
                 KVCache.init(target.config, 1, T + 8), config=target.config)
  return np.asarray(h[0], np.float32)


# --- EAGLE-1/2 --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eagle_pair(target, tmp_path_factory):
  """(vocabjax config, params, the reference Model with the same weights) of a random EAGLE-1/2
  head, written in the authors' layout and read by both sides. RoPE base 10000: the PyPI release
  ignores config.json's rope_theta (EAGLE-2's GitHub code reads it)."""
  monkey = pytest.MonkeyPatch()
  monkey.setenv("VOCABJAX_ALLOW_BIN", "1")
  layer = dataclasses.replace(target.config, arch="llama", num_layers=1, attention_bias=False,
                              tie_word_embeddings=False, rope_theta=10000.0)
  hc = EagleConfig(layer=layer, target_hidden_size=target.config.hidden_size,
                   feature_layers=(FINAL_NORMED,), draft_vocab_size=target.config.vocab_size,
                   kind="eagle2")
  p = init_eagle(jax.random.key(7), hc, scale=0.3)
  rs = np.random.RandomState(7)
  p["input_fc_bias"] = jnp.asarray(0.1 * rs.randn(hc.hidden_size), jnp.float32)
  p["layer"]["mlp_norm"] = jnp.asarray(1 + 0.1 * rs.randn(hc.hidden_size), jnp.float32)
  d = save_eagle2(p, hc, tmp_path_factory.mktemp("eagle2") / "head", pickled=True,
                  embed=target.params["embed"])
  cfg, ours, _ = load_eagle2(d, target_config=target.config, target_params=target.params)
  Model, _ = references.eagle1_head()
  import json

  raw = json.loads((d / "config.json").read_text())
  ref = Model(references.eagle1_config(raw), bias=raw["bias"]).eval()
  ref.load_state_dict(torch.load(d / "pytorch_model.bin", weights_only=True), strict=True)
  monkey.undo()
  return cfg, ours, ref


def _ref_step(ref, feats, ids, kv=None):
  with torch.no_grad():
    out, kv = ref(torch.from_numpy(feats)[None], input_ids=torch.tensor(ids)[None],
                  past_key_values=kv, use_cache=True)
  return out[0].numpy(), kv


@pytest.mark.extended
def test_eagle12_head_output_and_logits_match_the_reference(target, eagle_pair):
  cfg, ours, ref = eagle_pair
  U = np.asarray(lm_head_weight(target.params, target.config), np.float32)
  for text in PROMPTS:
    ids = target.tokenizer(text)["input_ids"]
    feats = _hidden(target, ids)
    tokens, feats = ids[1:], feats[:-1]  # entry p: token p + 1 with feature p (EAGLE's shift)
    T = len(tokens)
    x, _ = eagle_forward(ours, target.params["embed"], jnp.asarray(tokens)[None],
                         jnp.asarray(feats)[None], jnp.arange(T)[None],
                         KVCache.init(cfg.layer, 1, T + 8), config=cfg)
    want, _ = _ref_step(ref, feats, tokens)
    np.testing.assert_allclose(np.asarray(x[0]), want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(x[0]) @ U.T, want @ U.T, atol=1e-4, rtol=1e-4)
    # in two cached calls (the prompt, then the last two entries), as drafting runs it
    cache = KVCache.init(cfg.layer, 1, T + 8)
    _, cache = eagle_forward(ours, target.params["embed"], jnp.asarray(tokens[:-2])[None],
                             jnp.asarray(feats[:-2])[None], jnp.arange(T - 2)[None], cache,
                             config=cfg)
    x2, _ = eagle_forward(ours, target.params["embed"], jnp.asarray(tokens[-2:])[None],
                          jnp.asarray(feats[-2:])[None], jnp.arange(T - 2, T)[None], cache,
                          config=cfg)
    _, kv = _ref_step(ref, feats[:-2], tokens[:-2])
    want2, _ = _ref_step(ref, feats[-2:], tokens[-2:], kv)
    np.testing.assert_allclose(np.asarray(x2[0]), want2, atol=1e-4, rtol=1e-4)


@pytest.mark.extended
def test_eagle12_greedy_drafts_match_the_reference(target, eagle_pair):
  """Each side drafts 5 tokens greedily from the same context: the head's output at an entry
  feeds back as the next entry's feature, its argmax through the target's head is the next
  token (EAGLE's recursion; a chain is the tree of top_k 1)."""
  cfg, ours, ref = eagle_pair
  U = np.asarray(lm_head_weight(target.params, target.config), np.float32)
  depth = 5
  for text in PROMPTS:
    ids = target.tokenizer(text)["input_ids"]
    feats = _hidden(target, ids)
    nxt = int(np.argmax(feats[-1] @ U.T))  # the target's own next token: the root
    tokens, f = ids[1:] + [nxt], feats  # entries 0 .. T - 1, the last one the root's
    T = len(tokens)
    cache = KVCache.init(cfg.layer, 1, T + depth + 8)
    x, cache = eagle_forward(ours, target.params["embed"], jnp.asarray(tokens)[None],
                             jnp.asarray(f)[None], jnp.arange(T)[None], cache, config=cfg)
    ours_drafts, last = [], np.asarray(x[0, -1])
    for d in range(depth):
      tok = int(np.argmax(last @ U.T))
      ours_drafts.append(tok)
      x, cache = eagle_forward(ours, target.params["embed"], jnp.asarray([[tok]]),
                               jnp.asarray(last)[None, None], jnp.asarray([[T + d]]), cache,
                               config=cfg)
      last = np.asarray(x[0, -1])
    out, kv = _ref_step(ref, f, tokens)
    ref_drafts, last = [], out[-1]
    for _ in range(depth):
      tok = int(np.argmax(last @ U.T))
      ref_drafts.append(tok)
      out, kv = _ref_step(ref, last[None], [tok], kv)
      last = out[-1]
    assert ours_drafts == ref_drafts, text


# --- Medusa-1 ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def medusa_pair(target, tmp_path_factory):
  """(config, params, the reference heads with the same weights), read from Medusa's own
  `medusa_lm_head.pt` + config.json layout: 3 heads of 2 shared residual blocks each."""
  from vocabjax.checkpoints.medusa import load_medusa
  from vocabjax.models.medusa import MedusaConfig, init_medusa

  ResBlock, _ = references.medusa_reference()
  D, V = target.config.hidden_size, target.config.vocab_size
  Hm, Lm = 3, 2
  ref = torch.nn.ModuleList([torch.nn.Sequential(*([ResBlock(D)] * Lm),
                                                 torch.nn.Linear(D, V, bias=False))
                             for _ in range(Hm)])  # MedusaModel's heads
  torch.manual_seed(0)
  with torch.no_grad():
    for prm in ref.parameters():
      prm.normal_(0, 0.2)
  d = tmp_path_factory.mktemp("medusa") / "heads"
  d.mkdir()
  torch.save(ref.state_dict(), d / "medusa_lm_head.pt")
  import json

  (d / "config.json").write_text(json.dumps({"medusa_num_heads": Hm, "medusa_num_layers": Lm,
                                             "base_model_name_or_path": "tiny"}))
  monkey = pytest.MonkeyPatch()
  monkey.setenv("VOCABJAX_ALLOW_BIN", "1")
  mc, params, _ = load_medusa(d, target_config=target.config)
  monkey.undo()
  assert mc == MedusaConfig(num_heads=Hm, hidden_size=D, vocab_size=V, num_layers=Lm)
  del init_medusa
  return mc, params, ref.eval()


def test_medusa_heads_logits_match_the_reference(target, medusa_pair):
  from vocabjax.models.medusa import medusa_logits

  mc, params, ref = medusa_pair
  for text in PROMPTS:
    h = _hidden(target, target.tokenizer(text)["input_ids"])
    ours = np.asarray(medusa_logits(params, jnp.asarray(h), config=mc))  # [T, Hm, V]
    with torch.no_grad():
      want = torch.stack([head(torch.from_numpy(h)) for head in ref], dim=1).numpy()
    np.testing.assert_allclose(ours, want, atol=1e-4, rtol=1e-4)


@pytest.mark.extended
@pytest.mark.parametrize("per_level", [[3, 2], [2, 2, 2], [4]])
def test_medusa_tree_candidates_and_acceptance_match_the_reference(target, medusa_pair,
                                                                   per_level):
  """Medusa's dense tree `[1, *per_level]` (its PyPI release's `medusa_choices`) is vocabjax's
  tree of every product path: the same attention mask and node positions, each node drafted
  by the same head at the same rank, the same candidate tokens from the same logits, and the
  same accepted length from the target's logits on the tree (greedy)."""
  from vocabjax.decoding.medusa import MEDUSA_KEY, medusa_candidates
  from vocabjax.decoding.tree import TreeBounds, verify_tree
  from vocabjax.models.medusa import medusa_logits, medusa_tree
  from vocabjax.sampling import SamplingParams

  mc, params, ref = medusa_pair
  _, utils = references.medusa_reference()
  import itertools

  choices = [list(p) for n in range(1, len(per_level) + 1)
             for p in itertools.product(*[range(k) for k in per_level[:n]])]
  tree = medusa_tree(choices, mc.num_heads)
  buf = utils.generate_medusa_buffers([1, *per_level], device="cpu")
  np.testing.assert_array_equal(tree.attention_mask(), buf["medusa_attn_mask"][0, 0].numpy() > 0)
  np.testing.assert_array_equal(np.concatenate([[0], tree.depth]),
                                buf["medusa_position_ids"].numpy())
  offsets = np.concatenate([[0], np.cumsum(per_level)])
  np.testing.assert_array_equal(1 + offsets[tree.head] + tree.rank,
                                buf["tree_indices"].numpy()[1:])
  for text in PROMPTS:
    ids = target.tokenizer(text)["input_ids"]
    h = _hidden(target, ids)
    U = np.asarray(lm_head_weight(target.params, target.config), np.float32)
    root = int(np.argmax(h[-1] @ U.T))
    ours = np.asarray(medusa_candidates({MEDUSA_KEY: params}, jnp.asarray(h[-1:]), config=mc,
                                        tree=tree))[0]
    heads_logits = np.asarray(medusa_logits(params, jnp.asarray(h[-1:]), config=mc))
    _, ref_tree = utils.generate_candidates(
        # [heads used, 1, 1, V]: the reference takes one head per tree level
        torch.from_numpy(heads_logits.transpose(1, 0, 2)[:len(per_level), :, None]),
        torch.from_numpy((h[-1:] @ U.T)[None]), per_level, buf["tree_indices"], 0.0)
    assert ref_tree[0, 0].item() == root
    np.testing.assert_array_equal(ours, ref_tree[0, 1:].numpy())
    # the target on the tree: vocabjax's verifier against the reference's greedy posterior
    T, n = len(ids), tree.size
    cache = KVCache.init(target.config, 1, T + n + 8)
    _, cache = forward(target.params, jnp.asarray(ids)[None], jnp.arange(T)[None], cache,
                       config=target.config)
    v = verify_tree(target.params, jnp.asarray([root]), jnp.asarray(ours)[None],
                    jnp.asarray(tree.parent)[None], jnp.asarray(tree.depth)[None], cache,
                    jax.random.key(0), target_config=target.config,
                    tree=TreeBounds(tree.max_children, tree.max_depth),
                    sampling=SamplingParams(temperature=0.0))
    nodes = np.concatenate([[root], ours])
    mask = tree.attention_mask()
    full = np.zeros((n + 1, T + n + 1), bool)
    full[:, :T] = True
    full[:, T:] = mask
    hn, _ = forward(target.params, jnp.asarray(nodes)[None],
                    jnp.asarray(T + np.concatenate([[0], tree.depth]))[None],
                    cache, jnp.asarray(mask)[None], config=target.config)
    logits = np.asarray(hn[0], np.float32) @ U.T  # [n + 1, V]
    ret = buf["retrieve_indices"]
    cand = torch.from_numpy(nodes)[ret]
    _, accept = utils.evaluate_posterior(torch.from_numpy(logits)[ret], cand, 0, 0.09, 0.3)
    assert int(v.accepted[0]) == int(accept), text
    del full


# --- EAGLE-3 ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eagle3_pair(target, tmp_path_factory):
  """(config, params, SpecForge's LlamaForCausalLMEagle3 with the same weights) of a random
  EAGLE-3 head with a 40-token draft vocabulary, read from the file vocabjax writes."""
  from safetensors.torch import load_file
  from transformers import LlamaConfig

  from vocabjax.checkpoints.eagle3 import load_eagle3, save_eagle3
  from vocabjax.train.eagle_step import head_config

  tc = target.config
  hc = head_config(tc, (0, tc.num_layers - 1, tc.num_layers - 1), 40)
  p = init_eagle(jax.random.key(11), hc, scale=0.3)
  rs = np.random.RandomState(11)
  for k in ("attn_norm", "hidden_norm", "mlp_norm"):
    p["layer"][k] = jnp.asarray(1 + 0.1 * rs.randn(hc.hidden_size), jnp.float32)
  p["final_norm"] = jnp.asarray(1 + 0.1 * rs.randn(hc.hidden_size), jnp.float32)
  p["d2t"] = jnp.asarray(np.sort(rs.choice(tc.vocab_size, 40, replace=False)) - np.arange(40))
  d = save_eagle3(p, hc, tmp_path_factory.mktemp("eagle3") / "head")
  cfg, ours, _ = load_eagle3(d, target_config=tc)
  Eagle3 = references.eagle3_head()
  c = hc.layer
  ref = Eagle3(LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_heads,
                           num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
                           intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
                           num_hidden_layers=1, rms_norm_eps=c.rms_norm_eps,
                           rope_theta=c.rope_theta, max_position_embeddings=256,
                           draft_vocab_size=40), attention_backend="sdpa").float().eval()
  state = load_file(str(d / "model.safetensors"))
  missing, unexpected = ref.load_state_dict(state, strict=False)
  assert missing == ["embed_tokens.weight"] and not unexpected  # the target's, set below
  with torch.no_grad():
    ref.embed_tokens.weight.copy_(torch.from_numpy(np.asarray(target.params["embed"])))
  return cfg, ours, ref


def _ref3(ref, tokens, hidden):
  """SpecForge's forward over a whole sequence (its no-cache path: positions 0 .. T - 1):
  (layer output [T, D], logits over the draft vocabulary [T, Vd])."""
  import torch._dynamo

  T = len(tokens)
  with torch.no_grad(), torch._dynamo.config.patch(disable=True):  # its @torch.compile'd norms
    out = ref.backbone(ref.embed_input_ids(torch.tensor(tokens)[None]), hidden[None],
                       cache_hidden=None, attention_mask=None,
                       position_ids=torch.arange(T)[None], past_key_values=None,
                       use_cache=False)
    return out[0], ref.compute_logits(out)[0]


def _features(target, ids, layers):
  from vocabjax.models.llamalike import forward_features

  T = len(ids)
  _, _, f = forward_features(target.params, jnp.asarray(ids)[None], jnp.arange(T)[None],
                             KVCache.init(target.config, 1, T + 8), config=target.config,
                             layers=layers)
  return np.asarray(f[0], np.float32)


@pytest.mark.extended
def test_eagle3_head_and_its_greedy_drafts_match_specforge(target, eagle3_pair):
  """The layer output and draft-vocabulary logits on prompt entries (fc over the three target
  layers' outputs), then 4 greedy drafts per prompt, each side feeding the layer's output back
  (no fc) and mapping draft ids to target ids through d2t."""
  from vocabjax.models.eagle import draft_to_target, eagle_logits, fuse_features

  cfg, ours, ref = eagle3_pair
  d2t = np.asarray(ours["d2t"])
  for text in PROMPTS:
    ids = target.tokenizer(text)["input_ids"]
    feats = _features(target, ids, cfg.feature_layers)
    tokens, feats = ids[1:], feats[:-1]
    T = len(tokens)
    h = fuse_features(ours, jnp.asarray(feats)[None])
    cache = KVCache.init(cfg.layer, 1, T + 8)
    x, cache = eagle_forward(ours, target.params["embed"], jnp.asarray(tokens)[None], h,
                             jnp.arange(T)[None], cache, config=cfg)
    with torch.no_grad():
      hr = ref.project_hidden_states(torch.from_numpy(feats)[None])[0]
    want_x, want_logits = _ref3(ref, tokens, hr)
    np.testing.assert_allclose(np.asarray(x[0]), want_x.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(eagle_logits(ours, x, config=cfg)[0]),
                               want_logits.numpy(), atol=1e-4, rtol=1e-4)
    ours_d, last = [], x[0, -1]
    for d in range(4):
      j = int(jnp.argmax(eagle_logits(ours, last, config=cfg)))
      tok = int(draft_to_target(ours, jnp.asarray(j)))
      ours_d.append(tok)
      x, cache = eagle_forward(ours, target.params["embed"], jnp.asarray([[tok]]),
                               last[None, None], jnp.asarray([[T + d]]), cache, config=cfg)
      last = x[0, -1]
    ref_d, seq, hid = [], list(tokens), hr
    out, logits = _ref3(ref, seq, hid)
    for _ in range(4):
      j = int(torch.argmax(logits[-1]))
      tok = j + int(d2t[j])
      ref_d.append(tok)
      seq, hid = seq + [tok], torch.cat([hid, out[-1:]], 0)
      out, logits = _ref3(ref, seq, hid)
    assert ours_d == ref_d, text


def test_a_medusa_file_with_more_heads_than_its_config_says_is_read_whole(target, medusa_pair,
                                                                         tmp_path, capsys):
  """Medusa's own vicuna-7b heads ship a config.json saying 2 heads beside a file of 5 (its
  loader reads them all): every head in the file is read, and the run says so."""
  import json

  from vocabjax.checkpoints.medusa import load_medusa, save_medusa

  mc, params, _ = medusa_pair
  d = save_medusa(params, mc, tmp_path / "h")
  raw = json.loads((d / "config.json").read_text())
  raw["medusa_num_heads"] = 1
  (d / "config.json").write_text(json.dumps(raw))
  mc2, p2, _ = load_medusa(d, target_config=target.config)
  assert mc2.num_heads == mc.num_heads == len(p2["heads"])
  assert "config.json says medusa_num_heads=1 but the file holds 3 heads" in capsys.readouterr().err


def test_an_eagle12_head_for_another_target_is_refused_by_name(target, eagle_pair, tmp_path):
  from vocabjax.checkpoints.eagle2 import load_eagle2, save_eagle2

  cfg, ours, _ = eagle_pair
  d = save_eagle2(ours, cfg, tmp_path / "h")
  for change, match in (({"hidden_size": 96}, "features of width 64, the target's hidden size "
                         "is 96"), ({"vocab_size": 321}, "vocabulary of 320 tokens, the target "
                                    "has V=321")):
    other = dataclasses.replace(target.config, **change)
    with pytest.raises(ValueError, match=match):
      load_eagle2(d, target_config=other)
