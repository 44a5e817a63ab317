"""EAGLE-3 heads in vLLM's `speculators` layout, written by `speculators` 0.9.0's own
`Eagle3Converter` (`vocabjax.testing.references`) from a head in SGLang's layout, on a tiny
8-layer target laid out on disk: its feature layer ids are one higher than SGLang's, given as
the converter's user gives them or left null (its default: the authors' layers); either way
vocabjax reads the same head and decodes exactly as with the original. Options of its head
that vocabjax's forward does not implement, another speculator type, a Qwen3 layer and the
embedding's output as a feature are refused in one line naming the field."""

import json
import shutil

import jax
import numpy as np
import pytest

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.eagle3 import load_eagle3, save_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models.eagle import init_eagle
from vocabjax.testing import references
from vocabjax.testing.proposers import greedy_identity
from vocabjax.testing.tiny import tiny_hf_model
from vocabjax.train.eagle_step import head_config

V, L, VD = 64, 8, 40
LAYERS = (1, 3, 4)  # the authors' default for 8 layers: (1, L // 2 - 1, L - 4)
PROMPTS = [[3, 9, 1], [7, 7, 12, 4, 0, 15, 2], [11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(root, vocabjax's target Model, the original head's directory in SGLang's layout)."""
  references.speculators_reference()
  root = tmp_path_factory.mktemp("eagle3-speculators")
  tiny_hf_model("qwen2", vocab_size=V, num_hidden_layers=L).save_pretrained(root / "target")
  target = load_model(root / "target", dtype="float32")
  hc = head_config(target.config, LAYERS, VD)
  p = init_eagle(jax.random.key(5), hc, scale=0.3)
  rs = np.random.RandomState(5)
  p["d2t"] = np.sort(rs.choice(V, VD, replace=False)) - np.arange(VD)
  return root, target, save_eagle3(p, hc, root / "original")


def _convert(setup, name, ids):
  from speculators.convert.eagle.eagle3_converter import Eagle3Converter

  root, _, original = setup
  Eagle3Converter().convert(original, root / name, base_model=str(root / "target"),
                            validate=False, eagle_aux_hidden_state_layer_ids=ids)
  return root / name


def _decode(target, config, params):
  engine = SpeculativeEngine(target.params, target.config, EagleProposer(
      target.params, target.config, params, config))
  return greedy_identity(engine, target.params, target.config, PROMPTS, max_new_tokens=16)


@pytest.mark.extended
@pytest.mark.parametrize("ids", [[i + 1 for i in LAYERS], None],
                         ids=["explicit-ids", "default-ids"])
def test_a_converted_head_drafts_as_the_original(setup, ids):
  """The converter's ids are SGLang's plus one (or null: its default); read back they are
  SGLang's, the tensors are the original's (its `layers.0.*` names), and decoding gives the
  same tokens and accepted lengths as the original head (and plain decoding's tokens)."""
  _, target, original = setup
  d = _convert(setup, "converted-" + ("explicit" if ids else "default"), ids)
  raw = json.loads((d / "config.json").read_text())
  assert raw["speculators_model_type"] == "eagle3"
  assert raw["eagle_aux_hidden_state_layer_ids"] == ids
  c0, p0, _ = load_eagle3(original, target_config=target.config)
  c1, p1, _ = load_eagle3(d, target_config=target.config)
  assert c1.feature_layers == c0.feature_layers == LAYERS
  assert (c1.draft_vocab_size, c1.target_hidden_size) == (VD, target.config.hidden_size)
  assert c1.layer.replace(max_position_embeddings=0) == c0.layer.replace(
      max_position_embeddings=0)  # the converter takes the target's longer context
  jax.tree.map(np.testing.assert_array_equal, p1, p0)
  a, b = _decode(target, c0, p0), _decode(target, c1, p1)
  assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def test_options_it_cannot_honour_are_refused(setup, tmp_path):
  """Each of speculators' head options set, a DFlash type, a P-EAGLE type without its mask
  token, a Qwen3 layer, layer id 0: refused naming the field; `target_hidden_size: null` (as
  speculators writes it) loads."""
  _, target, _ = setup
  d = _convert(setup, "converted-traps", [i + 1 for i in LAYERS])
  raw = json.loads((d / "config.json").read_text())

  def variant(name, changes, layer=None):
    out = tmp_path / name
    shutil.copytree(d, out)
    cfg = {**raw, **changes}
    if layer:
      cfg["transformer_layer_config"] = {**raw["transformer_layer_config"], **layer}
    (out / "config.json").write_text(json.dumps(cfg))
    return out

  assert load_eagle3(variant("null", {"target_hidden_size": None}),
                     target_config=target.config)[0].feature_layers == LAYERS
  for option in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
    with pytest.raises(CheckpointError, match=f"{option}=true: an option"):
      load_eagle3(variant(option, {option: True}))
  with pytest.raises(CheckpointError, match="speculators_model_type='dflash': a DFlash drafter"):
    load_eagle3(variant("dflash", {"speculators_model_type": "dflash"}))
  with pytest.raises(CheckpointError, match="mask_token_id=None: a P-EAGLE head needs"):
    load_eagle3(variant("peagle", {"speculators_model_type": "peagle"}))
  with pytest.raises(CheckpointError, match="model_type='qwen3'"):
    load_eagle3(variant("qwen3", {}, {"model_type": "qwen3"}))
  with pytest.raises(CheckpointError, match=r"eagle_aux_hidden_state_layer_ids=\[0, 4, 5\] "
                                            r"names 0"):
    load_eagle3(variant("zero", {"eagle_aux_hidden_state_layer_ids": [0, 4, 5]}))


def test_sglang_layout_options_and_d2t_traps_are_refused(setup, tmp_path):
  """In SGLang's / SpecForge's layout: `norm_output: false` (SpecForge: no final norm before
  the LM head), `norm_before_residual: true` and `fc_norm: true` refused naming the option; a
  d2t of absolute target ids beside its t2d refused naming the confusion; `target_hidden_size:
  null` reads as the head's width."""
  from safetensors.numpy import load_file, save_file

  _, target, original = setup
  raw = json.loads((original / "config.json").read_text())

  def variant(name, changes=None, tensors=None):
    out = tmp_path / name
    shutil.copytree(original, out)
    (out / "config.json").write_text(json.dumps({**raw, **(changes or {})}))
    if tensors:
      t = load_file(out / "model.safetensors")
      save_file({**t, **tensors}, out / "model.safetensors")
    return out

  assert load_eagle3(variant("null", {"target_hidden_size": None}),
                     target_config=target.config)[0].target_hidden_size == target.config.hidden_size
  for option, value in (("norm_output", False), ("norm_before_residual", True),
                        ("fc_norm", True)):
    with pytest.raises(CheckpointError, match=f"{option}={json.dumps(value)}: an option"):
      load_eagle3(variant(option, {option: value}))
  d2t = load_file(original / "model.safetensors")["d2t"]
  absolute = d2t + np.arange(VD)  # the target ids themselves
  with pytest.raises(CheckpointError, match="d2t holds the target ids themselves"):
    load_eagle3(variant("absolute", tensors={"d2t": absolute}))
  # two draft ids on one target id: the first bad draft id named
  twice = d2t.copy()
  twice[3] = twice[2] + 2 - 3  # draft id 3 -> the target id of draft id 2
  with pytest.raises(CheckpointError, match=r"not .*ascending ids .*\(first bad: draft id 3 -> "):
    load_eagle3(variant("twice", tensors={"d2t": twice}))
  with pytest.raises(CheckpointError, match="d2t holds float32 values; it must hold integer"):
    load_eagle3(variant("float", tensors={"d2t": d2t.astype(np.float32)}))
  t2d = load_file(original / "model.safetensors")["t2d"]  # the converter writes both
  with pytest.raises(CheckpointError, match=r"t2d has shape \(\d+,\)"):
    load_eagle3(variant("t2d_short", tensors={"t2d": t2d[:-1]}))
  with pytest.raises(CheckpointError, match=r"matching t2d .*\(first bad: draft id 0 -> "):
    load_eagle3(variant("t2d_false", tensors={"t2d": np.zeros_like(t2d)}))
  # no t2d to compare with: absolute ids refused where they are arange(Vd), the first Vd ids
  # (as offsets: the even ids); the same head over the first Vd ids, as offsets, loads
  bare = variant("no_t2d")
  t = {k: v for k, v in load_file(bare / "model.safetensors").items() if k != "t2d"}
  save_file({**t, "d2t": np.arange(VD, dtype=d2t.dtype)}, bare / "model.safetensors")
  with pytest.raises(CheckpointError, match=rf"d2t is arange\({VD}\): the target ids "
                                            r"themselves, not their offsets"):
    load_eagle3(bare)
  save_file({**t, "d2t": np.zeros(VD, d2t.dtype)}, bare / "model.safetensors")
  assert load_eagle3(bare)[0].draft_vocab_size == VD
  # speculators' layer ids copied to the top level of an SGLang config (flattened by hand):
  # refused, not read with the default layers (and their numbering is not known)
  with pytest.raises(CheckpointError, match=r"eagle_aux_hidden_state_layer_ids=\[1, 2, 3\] at "
                                            r"the top level of a config that is not speculators'"):
    load_eagle3(variant("flat", {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
