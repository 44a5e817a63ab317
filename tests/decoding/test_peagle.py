"""P-EAGLE (parallel EAGLE-3) heads: against `speculators` 0.9.0's `PEagleDraftModel` on the same
random weights (saved by its own `save_pretrained`, read by vocabjax: its layer ids one lower,
its trained embedding, `mask_hidden`, d2t / t2d), the logits of a pass's K positions equal the
reference's training forward over one rollout of K depths (1e-4); on the engine, greedy output
equal to plain greedy decoding (K = 1, 3, 6, the head's own rows, the target's head under a
subset and a ranker), the target's law kept when sampling (chi-square, with and without a
subset); the method by path; an EAGLE-3 head refused by `peagle`, a P-EAGLE head by `eagle`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.helpers.models import CFG, PROMPT, SMALL, random_prompts
from vocabjax.checkpoints.eagle3 import load_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.peagle import PEagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import init_params
from vocabjax.models.cache import KVCache
from vocabjax.models.eagle import eagle_forward, eagle_logits, fuse_features, init_eagle
from vocabjax.models.llamalike import forward_features
from vocabjax.sampling import SamplingParams
from vocabjax.testing import references
from vocabjax.testing.proposers import greedy_identity, target_law
from vocabjax.testing.tiny import tiny_hf_model
from vocabjax.train.eagle_step import head_config
from vocabjax.vocab.ranked import SpeculativeVocab, svd_ranker
from vocabjax.vocab.subset import VocabSubset

V, L, VD, MASK, K = 64, 8, 40, 7, 5
LAYERS = (1, 3, 4)


def peagle_config(target, layers=(0, 1), vd=None, mask=MASK):
  hc = head_config(target, layers, vd or target.vocab_size)
  return dataclasses.replace(hc, mask_token_id=mask)


# --- against speculators ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(vocabjax's target Model, speculators' PEagleDraftModel with random weights, vocabjax's
  (config, params) of the directory it saved)."""
  references.speculators_reference()
  from speculators.models.peagle import PEagleDraftModel
  from transformers import LlamaConfig

  root = tmp_path_factory.mktemp("peagle")
  tiny_hf_model("qwen2", vocab_size=V, num_hidden_layers=L).save_pretrained(root / "target")
  target = load_model(root / "target", dtype="float32")
  c = target.config
  rs = np.random.RandomState(3)
  ids = torch.tensor(np.sort(rs.choice(V, VD, replace=False)))
  t2d = torch.zeros(V, dtype=torch.bool)
  t2d[ids] = True
  layer = LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
                      intermediate_size=c.intermediate_size, vocab_size=V, num_hidden_layers=1,
                      rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                      max_position_embeddings=256)
  model = PEagleDraftModel.from_training_args(
      layer, t2d=t2d, d2t=ids - torch.arange(VD), draft_vocab_size=VD,
      verifier_name_or_path=str(root / "target"), target_layer_ids=[i + 1 for i in LAYERS],
      mask_token_id=MASK, draft_attn_impl="eager")
  gen = torch.Generator().manual_seed(4)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.startswith("verifier_"):
        continue
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.3 * noise)
  model.eval()
  model.save_pretrained(root / "head")
  return target, model, load_eagle3(root / "head", target_config=target.config)[:2], root / "head"


def _reference_logits(model, tokens, feats, anchor):
  """speculators' training forward over one sequence (its shifted batch: tokens x_1 .., the
  features g_0 ..) with every position at depth 0 and one rollout of depths 1 .. K - 1 from
  `anchor`: the logits of [anchor (depth 0), its depths 1 .. K - 1] [K, Vd]."""
  from speculators.models.peagle import core

  T = len(tokens)
  anchors = torch.cat([torch.arange(T), torch.full((K - 1,), anchor)])
  depth = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, K)])
  seen = []
  hook = model.lm_head.register_forward_hook(lambda m, a, out: seen.append(out))
  with pytest.MonkeyPatch.context() as mp, torch.no_grad():
    mp.setattr(core, "generate_cod_sample_indices", lambda **kw: (anchors, depth))
    mp.setattr(core, "compute_metrics", lambda **kw: (torch.zeros(()), {}))
    model(hidden_states=torch.from_numpy(feats)[None], input_ids=torch.tensor([tokens]),
          document_ids=torch.zeros((1, T), dtype=torch.long),
          loss_mask=torch.ones((1, T)), verifier_last_hidden_states=torch.zeros(
              (1, T, model.hidden_size)), num_depths=K)
  hook.remove()
  logits = seen[0][0]
  return torch.cat([logits[anchor:anchor + 1], logits[T:]]).numpy()


def test_the_heads_file_is_read_as_speculators_wrote_it(pair):
  target, model, (config, params), _ = pair
  assert config.parallel and config.mask_token_id == MASK
  assert config.feature_layers == LAYERS and config.draft_vocab_size == VD
  np.testing.assert_array_equal(np.asarray(params["embed_tokens"]),
                                model.embed_tokens.weight.detach().numpy())
  np.testing.assert_array_equal(np.asarray(params["mask_hidden"]),
                                model.mask_hidden.detach().numpy().reshape(-1))
  assert not np.allclose(np.asarray(params["embed_tokens"]),
                         np.asarray(target.params["embed"]))  # its own, trained embedding


@pytest.mark.extended
def test_a_pass_of_k_positions_matches_the_reference(pair):
  """For prompts of several lengths and anchors, vocabjax's pass (the committed entries, the
  root, K - 1 mask entries) gives the reference's logits at the anchor and its K - 1 depths,
  and the proposer's greedy drafts from the same committed entries are their argmaxes (through
  d2t)."""
  target, model, (config, params), _ = pair
  rs = np.random.RandomState(0)
  embed = params["embed_tokens"]
  proposer = PEagleProposer(target.params, target.config, params, config, drafts=K)
  proposer.prepare(layout="out_in", lowering=None)
  d2t = np.asarray(params["d2t"])
  for n in (6, 13):
    ids = rs.randint(0, V, n).tolist()
    _, _, f = forward_features(target.params, jnp.asarray([ids]), jnp.arange(n)[None],
                               KVCache.init(target.config, 1, n + 8), config=target.config,
                               layers=LAYERS)
    feats = np.asarray(f[0], np.float32)
    tokens, g = ids[1:], feats[:-1]  # entry p: (x_{p+1}, f_p)
    last = len(tokens) - K  # the reference indexes its sequence at anchor + depth
    for anchor in sorted({0, last // 2, last}):
      want = _reference_logits(model, tokens, g, anchor)
      cache = KVCache.init(config.layer, 1, 32)
      x, cache = eagle_forward(params, embed, jnp.asarray([tokens[:anchor + 1]]),
                               fuse_features(params, jnp.asarray(g[None, :anchor + 1])),
                               jnp.arange(anchor + 1)[None], cache, config=config)
      h = fuse_features(params, params["mask_hidden"][None, None])
      xm, _ = eagle_forward(params, embed, jnp.full((1, K - 1), MASK),
                            jnp.broadcast_to(h, (1, K - 1, h.shape[-1])),
                            anchor + jnp.arange(1, K)[None], cache, config=config)
      got = eagle_logits(params, jnp.concatenate([x[:, -1:], xm], axis=1), config=config)
      np.testing.assert_allclose(np.asarray(got[0]), want, atol=1e-4, rtol=1e-4)
      # the proposer's own pass from the same committed entries: the reference's argmaxes
      drafts, _ = proposer.propose(proposer.params, (None, x[:, -1], cache, None), None,
                                   jax.random.key(0), sampling=SamplingParams())
      j = np.argmax(want, axis=-1)
      assert np.asarray(drafts.tokens)[0].tolist() == (j + d2t[j]).tolist()


def test_the_speculators_head_decodes_as_plain_decoding_by_the_method(pair):
  """`peagle` with the directory speculators wrote, 4 drafts per pass."""
  from vocabjax.methods import METHODS

  target, _, _, head = pair
  engine = METHODS["peagle"].make(target, None, {"head": str(head), "gamma": 4})
  res = greedy_identity(engine, target.params, target.config,
                        random_prompts(seed=5, config=target.config), max_new_tokens=20)
  assert all(d == 4 for row in res.stats.drafted for d in row if d)


# --- on the engine ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["k1", "k3", "k6-vd", "k3-subset", "k3-ranker"])
def test_greedy_identical_to_plain_decoding(target, case):
  """K = 1, 3 and 6 drafts per pass over a batch of prompts; the head's own 40 rows (d2t), the
  target's head under a subset of half the vocabulary, under a ranker's 16 candidates."""
  k = int(case.split("-")[0][1:])
  vd = 40 if "vd" in case else None
  hc = peagle_config(CFG, vd=vd)
  hp = init_eagle(jax.random.key(k), hc, scale=0.3)
  if vd:
    hp["d2t"] = jnp.asarray(np.sort(np.random.RandomState(k).choice(CFG.vocab_size, vd,
                                                                     replace=False))
                            - np.arange(vd))
  vocab, lm_head = None, "own"
  if "subset" in case:
    vocab, lm_head = VocabSubset(ids=np.arange(0, CFG.vocab_size, 2),
                                 vocab_size=CFG.vocab_size), "target"
  if "ranker" in case:
    vocab, lm_head = SpeculativeVocab(svd_ranker(target, CFG, rank=4), k=16), "target"
  engine = SpeculativeEngine(target, CFG, PEagleProposer(target, CFG, hp, hc, drafts=k,
                                                         lm_head=lm_head, draft_vocab=vocab))
  res = greedy_identity(engine, target, CFG, random_prompts(seed=k), max_new_tokens=30)
  assert all(d == k for row in res.stats.drafted for d in row if d)


@pytest.mark.parametrize("subset", [False, True])
def test_sampling_keeps_the_targets_law(subset):
  """Each position's law returned as q: the first three tokens' joint law equals the target's
  (chi-square over V = 8), with the head's whole head and over 6 of the target's 8 rows."""
  t = init_params(jax.random.key(10), SMALL, scale=0.8)
  hc = peagle_config(SMALL, layers=(0,), mask=3)
  hp = init_eagle(jax.random.key(3), hc, scale=0.8)
  vocab = VocabSubset(ids=np.arange(6), vocab_size=8) if subset else None
  engine = SpeculativeEngine(t, SMALL, PEagleProposer(
      t, SMALL, hp, hc, drafts=2, lm_head="target" if subset else "own", draft_vocab=vocab))
  p, stats = target_law(engine, t, SMALL, PROMPT, SamplingParams(temperature=1.0))
  assert 0.05 < stats.acceptance_rate < 0.95
  assert p > 1e-3


def test_each_method_refuses_the_others_head(target, tmp_path):
  """`peagle` over an EAGLE-3 head and `eagle` over a P-EAGLE head: one line each."""
  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.errors import ConfigError
  from vocabjax.methods import METHODS

  hc = head_config(CFG, (0, 1), CFG.vocab_size)
  d = save_eagle3(init_eagle(jax.random.key(1), hc), hc, tmp_path / "eagle3")
  with pytest.raises(ConfigError, match="not a P-EAGLE one: draft with it by method eagle"):
    METHODS["peagle"].parse({"head": str(d)}, "test")
  with pytest.raises(ValueError, match="a P-EAGLE head .*method peagle"):
    EagleProposer(target, CFG, init_eagle(jax.random.key(1), peagle_config(CFG)),
                  peagle_config(CFG))
