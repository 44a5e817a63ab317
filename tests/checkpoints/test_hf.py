"""Hugging Face directories: sharded index, and every bad input named in the error."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.hf import load_hf
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.checkpoints.loader import load_model, parse_dtype


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


def _edit_config(d, **changes):
  cfg = json.loads((d / "config.json").read_text())
  cfg.update(changes)
  (d / "config.json").write_text(json.dumps(cfg))


def test_sharded_index_loads_same_params(tiny_dirs, tmp_path):
  src = tiny_dirs["qwen2_bias"]
  d = _copy(src, tmp_path / "sharded")
  tensors = load_file(d / "model.safetensors")
  (d / "model.safetensors").unlink()
  names = sorted(tensors)
  half = len(names) // 2
  shards = {"model-00001-of-00002.safetensors": names[:half],
            "model-00002-of-00002.safetensors": names[half:]}
  for fname, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, d / fname)
  index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
  (d / "model.safetensors.index.json").write_text(json.dumps(index))
  _, a, _ = load_hf(src)
  _, b, _ = load_hf(d)
  np.testing.assert_array_equal(np.asarray(a["layers"][1]["w_up"]),
                                np.asarray(b["layers"][1]["w_up"]))


def test_unknown_architecture(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  _edit_config(d, model_type="mamba")
  with pytest.raises(UnsupportedConfigError, match="model_type='mamba'"):
    load_hf(d)


def test_unsupported_fields_are_all_listed():
  base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2}
  with pytest.raises(UnsupportedConfigError) as e:
    config_from_hf({**base, "hidden_act": "gelu", "mlp_bias": True, "fancy_new_thing": 3,
                    "rope_scaling": {"rope_type": "longrope", "factor": 4.0}})
  msg = str(e.value)
  for part in ("hidden_act='gelu'", "mlp_bias=True", "fancy_new_thing=3", "rope_type='longrope'"):
    assert part in msg
  with pytest.raises(UnsupportedConfigError, match="use_sliding_window=True"):
    config_from_hf({**base, "use_sliding_window": True, "sliding_window": 16})
  assert config_from_hf(base).num_kv_heads == 2
  # what transformers writes for a model read from a GGUF file: bookkeeping, accepted
  assert config_from_hf({**base, "_model_name_or_path": "Smollm2 135M", "unk_token_id": 0}
                        ).num_kv_heads == 2


def test_missing_tensor_is_named(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  tensors = load_file(d / "model.safetensors")
  del tensors["model.layers.1.self_attn.v_proj.weight"]
  save_file(tensors, d / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight"):
    load_hf(d)


def test_wrong_shape_is_named(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  tensors = load_file(d / "model.safetensors")
  tensors["model.layers.0.mlp.down_proj.weight"] = np.zeros((64, 95), np.float32)
  save_file(tensors, d / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"down_proj\.weight has shape \(64, 95\), "
                                            r"expected \(64, 96\)"):
    load_hf(d)


def test_config_mismatching_the_tensors(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  _edit_config(d, num_hidden_layers=1)  # the file holds tensors of a layer the config lacks
  with pytest.raises(CheckpointError, match="unrecognized tensor"):
    load_hf(d)


def test_truncated_safetensors(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  data = (d / "model.safetensors").read_bytes()
  (d / "model.safetensors").write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match="corrupt or truncated"):
    load_hf(d)


def test_bad_paths_and_dtypes(tmp_path):
  with pytest.raises(FileNotFoundError,
                     match="is neither an existing path, a registry model nor a hub id"):
    load_model(tmp_path / "nope")
  with pytest.raises(ValueError, match="dtype='f8'"):
    parse_dtype("f8")
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError, match="no config.json"):
    load_model(tmp_path / "empty")


def test_load_model_with_tokenizer(tiny_chat_dir):
  model = load_model(tiny_chat_dir)
  assert model.tokenizer is not None and model.eos_token_ids[0] == 2
  assert model.params["embed"].dtype == np.float32  # CPU default


def test_bf16_on_cpu_narrows_the_weight_matrices_only(tiny_chat_dir):
  import jax.numpy as jnp

  f32 = load_model(tiny_chat_dir, load_tokenizer=False)
  bf = load_model(tiny_chat_dir, dtype="bf16", load_tokenizer=False)
  assert bf.dtype == jnp.bfloat16
  assert bf.params["embed"].dtype == jnp.bfloat16
  assert bf.params["layers"][0]["wq"].dtype == jnp.bfloat16
  assert bf.params["final_norm"].dtype == jnp.float32  # activations and cache stay f32
  assert bf.params["layers"][0]["bq"].dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(bf.params["layers"][0]["wq"], np.float32),
      np.asarray(f32.params["layers"][0]["wq"].astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_weight_is_refused_naming_the_tensor(tiny_dirs, tmp_path, bad):
  # a NaN or inf in a weight made every step emit token 0, greedy and sampled, with exit 0
  from vocabjax.checkpoints.loader import load_model

  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  tensors = load_file(d / "model.safetensors")
  w = tensors["model.layers.1.mlp.up_proj.weight"].copy()
  w[3, 5] = bad
  tensors["model.layers.1.mlp.up_proj.weight"] = w
  save_file(tensors, d / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"tensor \['layers'\]\[1\]\['w_up'\] .* holds 1 "
                                            r"non-finite value\(s\)"):
    load_model(d, load_tokenizer=False)


@pytest.mark.parametrize("change,match", [
    ({"num_attention_heads": 0}, r"num_attention_heads=0 must be a positive integer"),
    ({"hidden_size": 64.5}, r"hidden_size=64.5 must be a positive integer"),
    ({"num_hidden_layers": "2"}, r"num_hidden_layers='2' must be a positive integer"),
    ({"num_hidden_layers": None}, r"num_hidden_layers=None must be a positive integer"),
    ({"rms_norm_eps": -1}, r"rms_norm_eps=-1 must be a number in \(0, 1\)"),
    ("missing", r"config.json lacks \['num_hidden_layers'\]"),
])
def test_bad_size_fields_are_named_with_their_value(tiny_dirs, tmp_path, change, match):
  """A size of 0, 64.5 or "2", or a missing one, is an error naming the file, the field and the
  value (before: ZeroDivisionError, TypeError, KeyError 'num_hidden_layers', or 64.5 taken)."""
  from vocabjax.checkpoints.hf_config import InvalidConfigError

  d = _copy(tiny_dirs["llama_mha"], tmp_path / "m")
  if change == "missing":
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(cfg))
  else:
    _edit_config(d, **change)
  with pytest.raises(InvalidConfigError, match=match) as e:
    load_hf(d)
  assert str(e.value).startswith(str(d))


@pytest.mark.extended
def test_a_bad_config_is_one_error_line_on_the_command_lines(tiny_chat_dir, tmp_path):
  import subprocess
  import sys

  import yaml

  d = _copy(tiny_chat_dir, tmp_path / "m")
  _edit_config(d, num_attention_heads=0)
  bench = tmp_path / "b.jsonl"
  bench.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n')
  (tmp_path / "s.yaml").write_text(yaml.safe_dump({
      "name": "t", "target": str(d), "max_new_tokens": 4, "methods": [{"name": "ar",
                                                                       "method": "ar"}],
      "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}]}))
  for cmd in (["vocabjax.generate", "--target", str(d), "--prompt", "hi"],
              ["vocabjax.eval", "--config", str(tmp_path / "s.yaml"), "--out",
               str(tmp_path / "out")]):
    r = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (f"error: {d}/config.json: num_attention_heads=0 "
                                                 f"must be a positive integer")


def test_a_sharded_index_naming_a_file_outside_the_directory_is_refused(tiny_dirs, tmp_path):
  d = _copy(tiny_dirs["qwen2_bias"], tmp_path / "m")
  tensors = load_file(d / "model.safetensors")
  (d / "model.safetensors").unlink()
  outside = tmp_path / "outside.safetensors"
  save_file(tensors, outside)
  (d / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {k: "../outside.safetensors" for k in tensors}}))
  with pytest.raises(CheckpointError, match=r"names shard\(s\) outside .*\['../outside"):
    load_hf(d)


def test_a_pickled_state_dict_in_torchs_legacy_format_is_read(tmp_path):
  """A `.bin` written by torch.save's legacy (non-zip) serialization is read (without
  memory-mapping, which only the zip format allows) instead of refused; a file that is no
  weights file names itself with the loader's message cut between words."""
  import torch

  from vocabjax.checkpoints.hf import torch_state

  torch.save({"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)},
             tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)
  state = torch_state(tmp_path / "legacy.bin")
  np.testing.assert_array_equal(state["w"], np.arange(6.0, dtype=np.float32).reshape(2, 3))
  assert state["b"].dtype == np.float32 and state["b"].tolist() == [1.0, 1.0]
  (tmp_path / "junk.bin").write_bytes(b"not a pickle " * 40)
  with pytest.raises(CheckpointError, match=r"junk.bin: not a loadable PyTorch weights file") as e:
    torch_state(tmp_path / "junk.bin")
  msg = str(e.value)
  assert "\n" not in msg and msg.endswith((")", " ...)"))
