"""The suites that run the papers' experiments with the published heads
(configs/eval/published_*.yaml, docs/published_heads.md) cannot rot: each runs with its methods
exactly as shipped (the same hub ids) against a hub served on 127.0.0.1 that holds tiny
stand-ins at those names, in the authors' layouts: the gated Llama targets, EAGLE's EAGLE-1/2
and EAGLE-3 heads (pytorch_model.bin, their configs as published) and FR-Spec's freq_K.pt lists.
Every method keeps plain decoding's tokens; the FR-Spec rows are the lists' sizes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import yaml

from tests.helpers.heads import eagle2_config, eagle2_params
from tests.helpers.eval import QUESTIONS
from vocabjax.prompts import EVAL_CONFIG_DIR
from vocabjax.testing.local_hub import TOKEN, LocalHub

FR_SIZES = {65536: 160, 32768: 96, 16384: 64, 8192: 32}  # of the stand-in's V = 320


def _files(d):
  return {f.relative_to(d).as_posix(): f.read_bytes() for f in d.rglob("*") if f.is_file()}


@pytest.fixture(scope="module")
def six_layer_chat_dir(tmp_path_factory):
  """The tiny chat model's tokenizer on a 6-layer target: EAGLE-3's authors' heads read target
  layers (1, L/2 - 1, L - 4), which needs L >= 5."""
  from vocabjax.testing.tiny import tiny_hf_model, tiny_tokenizer

  d = tmp_path_factory.mktemp("six") / "m"
  tok = tiny_tokenizer(320)
  tiny_hf_model("llama", seed=4, vocab_size=len(tok), num_hidden_layers=6).save_pretrained(d)
  tok.save_pretrained(d)
  return d


@pytest.fixture(scope="module")
def hub(tiny_chat_dir, six_layer_chat_dir, tmp_path_factory):
  from vocabjax.checkpoints.eagle2 import save_eagle2
  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.models.eagle import default_feature_layers, init_eagle
  from vocabjax.train.eagle_step import head_config

  tmp = tmp_path_factory.mktemp("published")
  h = LocalHub()
  h.add("meta-llama/Meta-Llama-3-8B-Instruct", _files(tiny_chat_dir), gated=True)
  h.add("meta-llama/Llama-3.1-8B-Instruct", _files(six_layer_chat_dir), gated=True)
  m = load_model(tiny_chat_dir, dtype="float32")
  hc = eagle2_config(m.config)
  head = save_eagle2(eagle2_params(hc, seed=3), hc, tmp / "eagle2", pickled=True,
                     embed=m.params["embed"])
  h.add("yuhuili/EAGLE-LLaMA3-Instruct-8B", _files(head))
  rs = np.random.RandomState(0)
  (tmp / "fr").mkdir()
  for real, k in FR_SIZES.items():  # most frequent first, as fr.py writes them
    torch.save([int(i) for i in rs.permutation(m.config.vocab_size)[:k]],
               tmp / "fr" / f"freq_{real}.pt")
  h.add("thunlp/LLaMA3-Instruct-8B-FR-Spec", _files(tmp / "fr"))
  # EAGLE-3: the authors' pytorch_model.bin with midlayer.* names and a config that names no
  # fused layers (their code reads 1, L/2 - 1, L - 4) and carries no target_hidden_size
  m6 = load_model(six_layer_chat_dir, dtype="float32")
  hc3 = head_config(m6.config, default_feature_layers(m6.config.num_layers), 40)
  p = init_eagle(jax.random.key(5), hc3, scale=0.2)
  p["d2t"] = jnp.asarray(np.sort(rs.choice(m6.config.vocab_size, 40, replace=False))
                         - np.arange(40))
  ours = save_eagle3(p, hc3, tmp / "eagle3_ours")
  from safetensors.numpy import load_file

  (tmp / "eagle3").mkdir()
  cfg = json.loads((ours / "config.json").read_text())
  for k in ("eagle_config", "vocabjax", "target_hidden_size"):
    cfg.pop(k, None)
  (tmp / "eagle3" / "config.json").write_text(json.dumps(cfg))
  torch.save({k: torch.from_numpy(np.ascontiguousarray(v))
              for k, v in load_file(str(ours / "model.safetensors")).items()},
             tmp / "eagle3" / "pytorch_model.bin")
  h.add("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", _files(tmp / "eagle3"))
  yield h
  h.close()


@pytest.mark.extended
@pytest.mark.parametrize("suite", ["published_frspec_llama3", "published_eagle3_llama31"])
def test_a_published_suite_runs_as_shipped_on_stand_ins(suite, hub, tmp_path, monkeypatch):
  from huggingface_hub import constants

  from vocabjax.eval.__main__ import main, parse_args

  d = yaml.safe_load((EVAL_CONFIG_DIR / f"{suite}.yaml").read_text())
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline
  monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
  monkeypatch.setenv("HF_TOKEN", TOKEN)  # the Llama targets are gated
  monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[1:3]))
  cfg = {**d, "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}],
         "max_new_tokens": 8, "max_len": 256, "dtype": "float32"}  # methods as shipped
  path = tmp_path / f"{suite}.yaml"
  path.write_text(yaml.safe_dump(cfg))
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet",
                             "--allow-bin"]))
  by = {m["name"]: m for m in summary["methods"]}
  assert set(by) == {m["name"] for m in d["methods"]}
  for name, rec in by.items():
    assert rec["overall"]["match_rate"] == 1.0, name  # greedy identity with plain decoding
  if suite == "published_frspec_llama3":
    assert by["eagle2"]["draft_vocab_size"] == 320  # the target's whole head
    for real, k in FR_SIZES.items():
      assert by[f"eagle2_fr{real // 1024}k"]["draft_vocab_size"] == k
  else:
    assert by["eagle3_32k"]["draft_vocab_size"] == 40  # the head's own rows (d2t)
  assert {"pytorch_model.bin", "config.json"} <= {
      p.rsplit("/", 1)[1] for _, p, _, _ in hub.requests if "/resolve/" in p}
