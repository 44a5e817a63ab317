"""vocabjax's DFlash and DFlash 2 drafters against z-lab's `dflash` 0.1.0
(`DFlashDraftModel`, `DFlash2DraftModel`; `vocabjax.testing.references`), on the same random
weights written in z-lab's layout by the reference's own `save_pretrained`, and the same tiny
Qwen3 target (transformers' model and vocabjax's load of its files). Float32; 1e-4 on the
target features, each layer's output (DFlash 2's convolutions inside) and the draft logits;
DFlash 2's selected drafts; greedy blocks, outputs and accepted lengths of `dflash_generate`
against vocabjax's engine."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.helpers.dflash import our_drafts, randomize, ref_drafts
from vocabjax.checkpoints.dflash import load_dflash, save_dflash
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models.cache import KVCache
from vocabjax.models.dflash import block_forward, context_prefill, scale_logits
from vocabjax.models.llamalike import forward_features, lm_head_weight
from vocabjax.testing import references
from vocabjax.testing.tiny import tiny_hf_model

V, BLOCK, MASK = 16, 4, 5
PROMPTS = [[3, 9, 1], [7, 7, 12, 4, 0, 15, 2], [11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6}


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def pair(tmp_path_factory, request):
  """(the reference module, transformers' target, the reference drafter, vocabjax's target
  Model, vocabjax's (config, params) of the drafter's files). The drafter reads target layers
  1 and 3 of 4: the last one is the final normed hidden state in the reference's
  `output_hidden_states`. DFlash 2: convolutions of 2 taps over groups of 16 channels, a
  selector of rank 8 over each position's top 6."""
  ref = references.dflash_reference()
  from transformers import Qwen3Config

  v2 = request.param == "dflash2"
  root = tmp_path_factory.mktemp(request.param)
  target = randomize(tiny_hf_model("qwen3", vocab_size=V, num_hidden_layers=4), 0.15, 0)
  target.save_pretrained(root / "target")
  cfg = Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    rms_norm_eps=1e-5, max_position_embeddings=256)
  cfg.num_target_layers = 4
  cfg.dflash_config = {"target_layer_ids": [1, 3], "mask_token_id": MASK, "block_size": BLOCK,
                       **(DFLASH2 if v2 else {})}
  cfg.architectures = ["DFlash2DraftModel" if v2 else "DFlashDraftModel"]
  # seeds whose drafters get some drafts accepted by the random target
  draft = randomize((ref.DFlash2DraftModel if v2 else ref.DFlashDraftModel)(cfg), 0.15,
                     4 if v2 else 1)
  draft.save_pretrained(root / "draft")
  ours = load_model(root / "target", dtype="float32")
  return ref, target, draft, ours, load_dflash(root / "draft", target_config=ours.config)


def _features(ref, target, draft, ids):
  with torch.no_grad():
    out = target(torch.tensor([ids]), output_hidden_states=True)
  return ref.extract_context_feature(out.hidden_states, draft.target_layer_ids)


def test_config_read_as_the_reference_reads_it(pair):
  _, _, draft, ours, (config, _) = pair
  assert config.target_layer_ids == tuple(draft.target_layer_ids)
  assert (config.block_size, config.mask_token_id) == (draft.block_size, draft.mask_token_id)
  proposer = DFlashProposer(ours.params, ours.config, pair[4][1], config)
  assert proposer.feature_layers == (1, -1)  # layer 3 of 4: the final normed hidden state
  assert proposer.selector == isinstance(draft, pair[0].DFlash2DraftModel)
  if proposer.selector:
    assert {k: getattr(config, k) for k in DFLASH2} == DFLASH2


@pytest.mark.extended
def test_features_layers_and_logits_match_the_reference(pair):
  ref, target, draft, ours, (config, params) = pair
  proposer = DFlashProposer(ours.params, ours.config, params, config)
  U = np.asarray(lm_head_weight(ours.params, ours.config))
  outputs = []
  hooks = [layer.register_forward_hook(lambda m, a, out: outputs.append(out))
           for layer in draft.layers]
  try:
    for ids in PROMPTS:
      T = len(ids)
      want_feats = _features(ref, target, draft, ids)
      _, _, feats = forward_features(ours.params, jnp.asarray([ids]), jnp.arange(T)[None],
                                     KVCache.init(ours.config, 1, T + 8), config=ours.config,
                                     layers=proposer.feature_layers)
      np.testing.assert_allclose(np.asarray(feats), want_feats.numpy(), atol=1e-4, rtol=1e-4)
      block = [ids[-1] % V] + [MASK] * (BLOCK - 1)
      outputs.clear()
      with torch.no_grad():
        noise = target.get_input_embeddings().weight[torch.tensor([block])]
        h_ref = draft(target_hidden=want_feats, noise_embedding=noise,
                      position_ids=torch.arange(T + BLOCK)[None])
        logits_ref = draft.compute_logits(h_ref[:, 1:], target.lm_head).numpy()
      for n in range(1, config.layer.num_layers + 1):  # each layer's output, through the norm
        sub = {**params, "layers": params["layers"][:n]}
        h, _ = block_forward(sub, ours.params["embed"], jnp.asarray([block]), feats,
                             jnp.asarray([T]), KVCache.init(config.cache_config(), 1, T + 16),
                             config=config)
        with torch.no_grad():
          want = draft.norm(outputs[n - 1]).numpy()
        np.testing.assert_allclose(np.asarray(h), want, atol=1e-4, rtol=1e-4)
      logits = scale_logits(h[:, 1:] @ U.T, config)
      np.testing.assert_allclose(np.asarray(logits), logits_ref, atol=1e-4, rtol=1e-4)
      assert (our_drafts(proposer, h[:, 1:], block[0])
              == ref_drafts(ref, draft, h_ref[:, 1:], block[0], target.lm_head))
  finally:
    for hook in hooks:
      hook.remove()


@pytest.mark.extended
def test_greedy_blocks_outputs_and_accepted_lengths_match_dflash_generate(pair, monkeypatch):
  """`dflash_generate` (greedy, no stop tokens) and vocabjax's engine on each prompt: the same
  tokens, the same accepted length at every step before the reference shrinks its block to the
  room left, and each block the reference drafted equals vocabjax's drafts from
  the same committed context."""
  import time

  ref, target, draft, ours, (config, params) = pair
  monkeypatch.setattr(ref, "_cuda_time", time.perf_counter)  # its stats' clock syncs CUDA
  proposer = DFlashProposer(ours.params, ours.config, params, config)
  engine = SpeculativeEngine(ours.params, ours.config, proposer)
  new = 24
  blocks = []
  compute_logits = draft.compute_logits

  def recording(hidden, head):  # each block's greedy drafts (DFlash 2: the selector's path)
    logits = compute_logits(hidden, head)
    if not proposer.selector:
      blocks.append(torch.argmax(logits, dim=-1)[0].tolist())
    return logits

  draft.compute_logits = recording
  if proposer.selector:
    propose = draft.propose

    def recording_path(hidden, anchor, head, temperature):
      out = propose(hidden, anchor, head, temperature)
      blocks.append(out[0][0].tolist())
      return out

    draft.propose = recording_path
  accepted_any = 0
  try:
    for ids in PROMPTS:
      blocks.clear()
      out = ref.dflash_generate(draft, target, torch.tensor([ids]), new, None, temperature=0.0,
                                return_stats=True)
      want = out.output_ids[0, len(ids):].tolist()
      res = engine.generate([ids], max_new_tokens=new)
      assert res.tokens[0] == want[:len(res.tokens[0])] and len(res.tokens[0]) == new
      ref_acc = [n - 1 for n in out.acceptance_lengths]
      # the steps whose block the reference did not shrink to the room left
      ends = np.cumsum([0] + list(out.acceptance_lengths))
      full = int(np.sum(ends[:-1] + BLOCK <= new))
      ours_acc = [row[0] for row in res.stats.accepted]
      assert full >= 4 and ours_acc[:full] == ref_acc[:full], (full, ours_acc, ref_acc)
      accepted_any += sum(ref_acc)
      # each reference block against vocabjax's pass over the same committed context
      committed = list(ids) + want
      W = 48  # the context padded to one width: one set of shapes for every step
      _, _, feats = forward_features(
          ours.params, jnp.asarray([committed + [0] * (W - len(committed))]),
          jnp.arange(W)[None], KVCache.init(ours.config, 1, W), config=ours.config,
          layers=proposer.feature_layers)  # causal: a position's features see no padding
      cache = context_prefill(params, feats, KVCache.init(config.cache_config(), 1, W + BLOCK),
                              config=config)
      start = len(ids)
      for drafted, n in zip(blocks, out.acceptance_lengths):
        bs = min(BLOCK, len(ids) + new - start)  # the reference's block, shrunk at the end
        block = [committed[start]] + [MASK] * (bs - 1)
        h, _ = block_forward(params, ours.params["embed"], jnp.asarray([block]),
                             jnp.zeros((1, BLOCK, config.fused_width)), jnp.zeros((1,), int),
                             cache.with_lengths(jnp.asarray([start])), config=config)
        got = our_drafts(proposer, h[:, 1:], block[0])
        assert got == drafted, (start, got, drafted)
        start += n
  finally:
    draft.compute_logits = compute_logits
    draft.__dict__.pop("propose", None)
  assert accepted_any >= 3  # the comparison saw accepted drafts, not only rejections


def test_zlab_layout_with_top_level_fields_and_refusals(pair, tmp_path):
  """The same drafter with its fields at the top level of config.json loads the same (DFlash 2:
  also with its codebooks named as z-lab publishes them, without `.weight`); a DFlash 2
  config without its fields, DFlash 2 weights under a DFlash config, a mask token outside the
  vocabulary and a target layer out of range are refused in one line naming the value."""
  import shutil

  from vocabjax.checkpoints.convert import CheckpointError

  _, _, draft, ours, (config, params) = pair
  src = tmp_path / "src"
  draft.save_pretrained(src)
  raw = json.loads((src / "config.json").read_text())
  flat = {**{k: v for k, v in raw.items() if k != "dflash_config"}, **raw["dflash_config"]}

  def variant(name, changes):
    d = tmp_path / name
    shutil.copytree(src, d)
    (d / "config.json").write_text(json.dumps({**flat, **changes}))
    return d

  c2, p2 = load_dflash(variant("flat", {}), target_config=ours.config)
  assert c2 == config
  np.testing.assert_array_equal(np.asarray(p2["fc"]), np.asarray(params["fc"]))
  if config.dflash2:
    from safetensors.torch import load_file, save_file

    d = variant("published", {})
    tensors = load_file(d / "model.safetensors")
    save_file({k.removesuffix(".weight") if "codebook" in k else k: v
               for k, v in tensors.items()}, d / "model.safetensors")
    _, p3 = load_dflash(d, target_config=ours.config)
    np.testing.assert_array_equal(np.asarray(p3["selector"]["pred"]),
                                  np.asarray(params["selector"]["pred"]))
    ref = pair[0]  # vocabjax's writer, read back by the reference's from_pretrained
    mine = save_dflash(params, config, tmp_path / "ours", num_target_layers=4)
    back = ref.DFlash2DraftModel.from_pretrained(mine, torch_dtype=torch.float32)
    want = draft.state_dict()
    for name, value in back.state_dict().items():
      np.testing.assert_allclose(value.numpy(), want[name].numpy(), atol=0, rtol=0, err_msg=name)
    with pytest.raises(CheckpointError, match="selector_rank=None"):
      load_dflash(variant("v2-fields", {"selector_rank": None}))
    with pytest.raises(CheckpointError, match=r"attention_conv.* not part of the DFlash drafter"):
      load_dflash(variant("as-v1", {"architectures": ["DFlashDraftModel"],
                                    **{k: None for k in DFLASH2}}))
  else:
    with pytest.raises(CheckpointError, match="DFlash 2 .* conv_kernel_size=None"):
      load_dflash(variant("v2", {"architectures": ["DFlash2DraftModel"]}))
  with pytest.raises(CheckpointError, match=f"mask_token_id=99 .* V={V}"):
    load_dflash(variant("mask", {"mask_token_id": 99}))
  with pytest.raises(ValueError, match=r"target_layer_ids=\[1, 7\] name layers \[7\]"):
    load_dflash(variant("layers", {"target_layer_ids": [1, 7]}), target_config=ours.config)
  # speculators' key in a z-lab config (flattened by hand): refused, not left for the default
  with pytest.raises(CheckpointError, match=r"aux_hidden_state_layer_ids=\[2, 3\] at the top "
                                            r"level of a config that is not speculators'"):
    load_dflash(variant("flat-speculators", {"aux_hidden_state_layer_ids": [2, 3]}))
