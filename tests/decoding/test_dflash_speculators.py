"""DFlash and DFlash 2 drafters in vLLM's `speculators` layout, written by `speculators` 0.9.0
itself (`vocabjax.testing.references`) on a tiny Qwen3 target laid out on disk: a z-lab drafter
converted by its `DFlashConverter` (which numbers the feature layers one higher) drafts the
same tokens as the original; a drafter with a head of its own over `draft_vocab_size` rows
(d2t / t2d) drafts what its head says and decodes as plain decoding does; a DFlash 2 drafter
written by `DFlash2DraftModel.save_pretrained` drafts as z-lab's module with the same weights;
the traps (a d2t of absolute ids, the embedding's output as a feature layer, drafting at the
anchor, a head of its own on DFlash 2) are refused in one line naming the value."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.helpers.dflash import our_drafts, randomize, ref_drafts
from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.dflash import load_dflash
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models.cache import KVCache
from vocabjax.models.dflash import block_forward
from vocabjax.models.llamalike import forward_features
from vocabjax.testing import references
from vocabjax.testing.proposers import greedy_identity
from vocabjax.testing.tiny import tiny_hf_model

V, BLOCK, MASK, L = 16, 4, 5, 4
PROMPTS = [[3, 9, 1], [7, 7, 12, 4, 0, 15, 2], [11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
OWN_IDS = [0, 1, 2, 3, 5, 6, 8, 9, 12, 15]  # the target ids of a 10-row head of its own


def _layer_config():
  from transformers import Qwen3Config

  return Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     rms_norm_eps=1e-5, max_position_embeddings=256)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(root, the reference dflash module, the speculators package, vocabjax's target Model)."""
  ref = references.dflash_reference()
  spec = references.speculators_reference()
  root = tmp_path_factory.mktemp("speculators")
  target = randomize(tiny_hf_model("qwen3", vocab_size=V, num_hidden_layers=L), 0.15, 0)
  target.save_pretrained(root / "target")
  return root, ref, spec, load_model(root / "target", dtype="float32")


def _zlab(ref, cls, ids, seed, **fields):
  cfg = _layer_config()
  cfg.num_target_layers = L
  cfg.dflash_config = {"target_layer_ids": ids, "mask_token_id": MASK, "block_size": BLOCK,
                       **fields}
  cfg.architectures = [cls.__name__]
  return randomize(cls(cfg), 0.15, seed)


def _block_hidden(ours, proposer, config, params, ids):
  """(the final hidden states [1, bs, D] of one block after prompt `ids`, the block) without
  an engine: the committed context prefilled from the target's features."""
  from vocabjax.models.dflash import context_prefill

  T = len(ids)
  _, _, feats = forward_features(ours.params, jnp.asarray([ids]), jnp.arange(T)[None],
                                 KVCache.init(ours.config, 1, T + 8), config=ours.config,
                                 layers=proposer.feature_layers)
  cache = context_prefill(params, feats, KVCache.init(config.cache_config(), 1, T + BLOCK),
                          config=config)
  block = [ids[-1]] + [MASK] * (BLOCK - 1)
  h, _ = block_forward(params, ours.params["embed"], jnp.asarray([block]),
                       jnp.zeros((1, BLOCK, config.fused_width)), jnp.zeros((1,), int),
                       cache.with_lengths(jnp.asarray([T])), config=config)
  return h, block


def _block_drafts(ours, proposer, config, params, ids):
  """vocabjax's greedy drafts of one block after prompt `ids`."""
  h, block = _block_hidden(ours, proposer, config, params, ids)
  return our_drafts(proposer, h[:, 1:], block[0])


@pytest.mark.extended
def test_a_converted_zlab_drafter_drafts_as_the_original(setup):
  """z-lab's layer ids (0, 2) become speculators' (1, 3) in the converted config; read back
  they are (0, 2) again, the weights are the same, and the engine's output and accepted
  lengths are the original's (and plain decoding's)."""
  root, ref, _, ours = setup
  from speculators.convert.dflash.converter import DFlashConverter

  _zlab(ref, ref.DFlashDraftModel, [0, 2], 1).save_pretrained(root / "zlab")
  DFlashConverter().convert(root / "zlab", root / "converted", base_model=str(root / "target"),
                            validate=True)
  raw = json.loads((root / "converted" / "config.json").read_text())
  assert raw["speculators_model_type"] == "dflash" and raw["aux_hidden_state_layer_ids"] == [1, 3]
  c0, p0 = load_dflash(root / "zlab", target_config=ours.config)
  c1, p1 = load_dflash(root / "converted", target_config=ours.config)
  assert c1.target_layer_ids == c0.target_layer_ids == (0, 2)
  assert (c1.block_size, c1.mask_token_id, c1.layer) == (c0.block_size, c0.mask_token_id,
                                                          c0.layer)
  import jax

  jax.tree.map(np.testing.assert_array_equal, p1, p0)
  runs = []
  for c, p in ((c0, p0), (c1, p1)):
    engine = SpeculativeEngine(ours.params, ours.config, DFlashProposer(ours.params, ours.config,
                                                                        p, c))
    runs.append(greedy_identity(engine, ours.params, ours.config, PROMPTS, max_new_tokens=16))
  assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted == runs[1].stats.accepted


@pytest.fixture(scope="module")
def own_head(setup):
  """A speculators DFlash drafter over 10 target ids (draft_vocab_size=10, d2t / t2d), its
  random weights set and written by its own save_pretrained."""
  root = setup[0]
  from speculators.models.dflash import DFlashDraftModel

  ids = torch.tensor(OWN_IDS)
  t2d = torch.zeros(V, dtype=torch.bool)
  t2d[ids] = True
  d2t = ids - torch.arange(len(OWN_IDS))
  model = DFlashDraftModel.from_training_args(
      _layer_config(), t2d=t2d, d2t=d2t, draft_vocab_size=len(OWN_IDS), block_size=BLOCK,
      verifier_name_or_path=str(root / "target"), target_layer_ids=[1, 3], mask_token_id=MASK)
  gen = torch.Generator().manual_seed(2)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if not name.startswith(("embed_tokens", "verifier_")):
        p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen) if name.endswith("norm.weight")
                else 0.15 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(root / "own")
  return root / "own", model


def test_a_head_of_its_own_loads_and_decodes_as_plain_decoding(setup, own_head, capsys):
  """Loaded: layer ids (0, 2), the module's 10-row head, its vocabulary map said in one line;
  decoding equals plain decoding."""
  ours = setup[3]
  d, model = own_head
  config, params = load_dflash(d, target_config=ours.config)
  assert (f"{d}: a head over 10 of the target's 16 ids (62.5%; target ids 0, 1, 2, 3, ..., 15)"
          in capsys.readouterr().err)
  assert config.target_layer_ids == (0, 2) and config.draft_vocab_size == len(OWN_IDS)
  np.testing.assert_array_equal(np.asarray(params["lm_head"]),
                                model.lm_head.weight.detach().numpy())
  engine = SpeculativeEngine(ours.params, ours.config, DFlashProposer(
      ours.params, ours.config, params, config))
  res = greedy_identity(engine, ours.params, ours.config, PROMPTS, max_new_tokens=16)
  assert sum(map(sum, res.stats.drafted)) > 0


@pytest.mark.extended
def test_own_head_drafts_match_the_speculators_rows(setup, own_head):
  """The drafted ids: argmax over h @ lm_head^T of the module's rows, then + d2t (so only the
  head's 10 ids), with h the block's hidden states vocabjax computes (its layers are checked
  against z-lab's elsewhere)."""
  _, _, _, ours = setup
  d, model = own_head
  config, params = load_dflash(d, target_config=ours.config)
  engine = SpeculativeEngine(ours.params, ours.config, DFlashProposer(
      ours.params, ours.config, params, config))
  proposer = engine.proposer
  W = model.lm_head.weight.detach().numpy()
  d2t = model.d2t.numpy()
  for ids in PROMPTS:
    h, block = _block_hidden(ours, proposer, config, proposer.params["dflash"], ids)
    j = np.argmax(np.asarray(h[0, 1:]) @ W.T, axis=-1)
    want = (j + d2t[j]).tolist()
    assert our_drafts(proposer, h[:, 1:], block[0]) == want and set(want) <= set(OWN_IDS)


def test_dflash2_written_by_speculators_drafts_as_zlab_module(setup):
  """speculators' DFlash2DraftModel (aux ids (1, 3), conv 2 x 16, selector rank 8 top 6) saved
  by itself; vocabjax reads target layers (0, 2) and drafts each block as z-lab's
  DFlash2DraftModel holding the same tensors does (its selector's path included)."""
  root, ref, _, ours = setup
  from speculators.models.dflash2 import DFlash2DraftModel

  model = DFlash2DraftModel.from_training_args(
      _layer_config(), draft_vocab_size=V, block_size=BLOCK, verifier_name_or_path=str(
          root / "target"), target_layer_ids=[1, 3], mask_token_id=MASK, conv_kernel_size=2,
      conv_group_size=16, selector_rank=8, selector_top_k=6)
  randomize(model, 0.15, 3)
  with torch.no_grad():  # the verifier's own tensors back (randomize touched them)
    model.load_verifier_weights()
  model.save_pretrained(root / "v2")
  config, params = load_dflash(root / "v2", target_config=ours.config)
  assert config.dflash2 and config.target_layer_ids == (0, 2) and config.causal is False
  zlab = _zlab(ref, ref.DFlash2DraftModel, [0, 2], 9, conv_kernel_size=2, conv_group_size=16,
               selector_rank=8, selector_top_k=6)
  theirs = model.state_dict()
  with torch.no_grad():
    for name, p in zlab.named_parameters():
      p.copy_(theirs[name.removesuffix(".weight") if "codebook" in name else name])
  proposer = DFlashProposer(ours.params, ours.config, params, config)
  target = ours_torch(root)
  for ids in PROMPTS:
    with torch.no_grad():
      out = target(torch.tensor([ids]), output_hidden_states=True)
      feats = ref.extract_context_feature(out.hidden_states, zlab.target_layer_ids)
      block = [ids[-1]] + [MASK] * (BLOCK - 1)
      noise = target.get_input_embeddings().weight[torch.tensor([block])]
      h_ref = zlab(target_hidden=feats, noise_embedding=noise,
                   position_ids=torch.arange(len(ids) + BLOCK)[None])
    want = ref_drafts(ref, zlab, h_ref[:, 1:], block[0], target.lm_head)
    assert _block_drafts(ours, proposer, config, params, ids) == want


def ours_torch(root):
  from transformers import AutoModelForCausalLM

  return AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()


def test_traps_are_refused_naming_the_value(setup, own_head, tmp_path):
  """A d2t of absolute target ids (t2d says so), a t2d that disagrees, the embedding's output
  as a feature layer (id 0), drafting at the anchor, DFlash 2 with a head of its own."""
  from safetensors.torch import load_file, save_file

  d, _ = own_head

  def variant(name, config=None, tensors=None):
    out = tmp_path / name
    shutil.copytree(d, out)
    if config:
      raw = json.loads((d / "config.json").read_text())
      (out / "config.json").write_text(json.dumps({**raw, **config}))
    if tensors:
      t = load_file(d / "model.safetensors")
      save_file({**t, **tensors}, out / "model.safetensors")
    return out

  absolute = torch.tensor(OWN_IDS)
  with pytest.raises(CheckpointError, match="d2t holds the target ids themselves"):
    load_dflash(variant("absolute", tensors={"d2t": absolute}))
  t2d = torch.zeros(V, dtype=torch.bool)
  t2d[:10] = True
  with pytest.raises(CheckpointError, match="not 10 ascending ids of \\[0, 16\\) matching t2d"):
    load_dflash(variant("t2d", tensors={"t2d": t2d}))
  with pytest.raises(CheckpointError, match=r"aux_hidden_state_layer_ids=\[0, 3\] names 0"):
    load_dflash(variant("embedding", {"aux_hidden_state_layer_ids": [0, 3]}))
  with pytest.raises(CheckpointError, match="sample_from_anchor=true"):
    load_dflash(variant("anchor", {"sample_from_anchor": True}))
  with pytest.raises(CheckpointError, match="draft_vocab_size=10: a DFlash 2"):
    load_dflash(variant("v2-own", {"speculators_model_type": "dflash2", "conv_kernel_size": 2,
                                   "conv_group_size": 16, "selector_rank": 8,
                                   "selector_top_k": 6}))


def test_written_in_speculators_layout_reads_back_in_both(setup, own_head, tmp_path):
  """`save_dflash` of a drafter with a head of its own writes speculators' layout: vocabjax
  reads back the same tensors and config, and speculators' own `DFlashDraftModel` loads the
  file with the same head, d2t, t2d and layers."""
  from speculators.models.dflash import DFlashDraftModel

  from vocabjax.checkpoints.dflash import save_dflash

  ours = setup[3]
  d, model = own_head
  config, params = load_dflash(d, target_config=ours.config)
  save_dflash(params, config, tmp_path / "again", num_target_layers=L,
              verifier=str(setup[0] / "target"))
  raw = json.loads((tmp_path / "again" / "config.json").read_text())
  assert raw["speculators_model_type"] == "dflash" and raw["aux_hidden_state_layer_ids"] == [1, 3]
  assert raw["draft_vocab_size"] == len(OWN_IDS)
  c2, p2 = load_dflash(tmp_path / "again", target_config=ours.config)
  assert c2 == config
  import jax

  jax.tree.map(np.testing.assert_array_equal, p2, params)
  back = DFlashDraftModel.from_pretrained(str(tmp_path / "again"))
  want = dict(model.state_dict())
  got = dict(back.state_dict())
  for name, value in want.items():
    if name.startswith(("verifier_", "embed_tokens")):
      continue
    np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
  assert list(back.target_layer_ids) == list(model.target_layer_ids)
