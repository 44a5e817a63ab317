"""Hub ids (`org/name[@revision]`) downloaded for real through huggingface_hub from a hub the
test serves on 127.0.0.1 (`vocabjax.testing.local_hub`): the cache, a pinned revision, sharded
safetensors, gated repositories, pickled weights refused then allowed, a download cut mid-file
(resumed with a Range request), corrupt bytes (caught by their hash), offline answers from the
cache, and every error one line before anything is downloaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vocabjax.checkpoints.hub import HubError, HubId, parse_hub_id
from vocabjax.checkpoints.loader import load_model
from vocabjax.testing.local_hub import TOKEN, LocalHub

ROOT = Path(__file__).resolve().parents[2]


def _files(d: Path) -> dict[str, bytes]:
  return {f.relative_to(d).as_posix(): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


@pytest.fixture
def served(tmp_path, monkeypatch, tiny_chat_dir):
  """A local hub holding `tiny_chat_dir` as org/tiny (and a gated copy), the client's cache
  in tmp_path, no token, online."""
  cache = tmp_path / "hf-cache"
  with LocalHub() as h:
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite runs offline
    monkeypatch.delenv("VOCABJAX_ALLOW_BIN", raising=False)
    h.sha = h.add("org/tiny", _files(tiny_chat_dir))
    h.add("org/gated", _files(tiny_chat_dir), gated=True)
    h.cache = cache
    yield h


def _params_equal(a, b):
  import jax

  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("text,want", [
    ("org/name", HubId("org/name")),
    ("Qwen/Qwen2.5-7B-Instruct@v1.0", HubId("Qwen/Qwen2.5-7B-Instruct", "v1.0")),
    ("org/name@refs%2Fpr%2F3/sub/ranker.safetensors",
     HubId("org/name", "refs/pr/3", "sub/ranker.safetensors")),
    ("hf://org/name/heads", HubId("org/name", "main", "heads")),
    ("./org/name", None), ("/abs/path", None), ("~/x/y", None), ("org/../x", None),
    ("justaname", None), ("org/name/../../etc", None), ("org/name@", None),
])
def test_parse_hub_id(text, want):
  assert parse_hub_id(text) == want


def test_a_hub_id_loads_like_the_directory_and_only_what_is_loaded_is_fetched(served,
                                                                              tiny_chat_dir):
  served.add("org/tiny", {**_files(tiny_chat_dir), "README.md": b"x" * 1000,
                          "flax_model.msgpack": b"y" * 4000, "pytorch_model.bin": b"z" * 4000})
  m = load_model("org/tiny", dtype="float32")
  ref = load_model(tiny_chat_dir, dtype="float32")
  _params_equal(m, ref)
  assert m.tokenizer is not None and m.eos_token_ids == ref.eos_token_ids
  gets = [p for meth, p, _, _ in served.requests if meth == "GET" and "/resolve/" in p]
  fetched = {p.rsplit("/", 1)[1] for p in gets}
  assert "config.json" in fetched and "README.md" not in fetched
  assert "flax_model.msgpack" not in fetched and "pytorch_model.bin" not in fetched
  # the second load reads the cache: no file is downloaded again
  n = len(served.requests)
  load_model("org/tiny", dtype="float32")
  assert not [r for r in served.requests[n:] if r[0] == "GET" and "/cdn/" in r[1]]


def test_a_revision_pins_the_files_of_that_commit(served, tiny_chat_dir, tmp_path):
  first = served.sha
  changed = _files(tiny_chat_dir)
  tensors = load_file(tiny_chat_dir / "model.safetensors")
  tensors = {k: v * 2 for k, v in tensors.items()}
  save_file(tensors, tmp_path / "m.safetensors")
  changed["model.safetensors"] = (tmp_path / "m.safetensors").read_bytes()
  served.add("org/tiny", changed)  # a new commit on main
  old, new = load_model(f"org/tiny@{first}", dtype="float32"), load_model("org/tiny",
                                                                          dtype="float32")
  _params_equal(old, load_model(tiny_chat_dir, dtype="float32"))
  assert not np.allclose(np.asarray(old.params["embed"]), np.asarray(new.params["embed"]))
  assert first in old.source and first not in new.source


def test_sharded_safetensors_download_the_index_and_its_shards(served, tiny_chat_dir,
                                                                tmp_path):
  files = {k: v for k, v in _files(tiny_chat_dir).items() if k != "model.safetensors"}
  tensors = load_file(tiny_chat_dir / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  for fname, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, tmp_path / fname)
    files[fname] = (tmp_path / fname).read_bytes()
  files["model.safetensors.index.json"] = json.dumps(
      {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}).encode()
  served.add("org/sharded", files)
  _params_equal(load_model("org/sharded", dtype="float32"),
                load_model(tiny_chat_dir, dtype="float32"))
  # an index naming a file outside the repository is refused before any shard is fetched
  files["model.safetensors.index.json"] = json.dumps(
      {"weight_map": {names[0]: "../../../etc/passwd"}}).encode()
  served.add("org/evil", files)
  with pytest.raises(HubError, match=r"names shard\(s\) that are not files of the repository"):
    load_model("org/evil")


def test_errors_are_one_line_and_come_before_any_download(served):
  cases = {
      "org/missing": "no repository org/missing on",
      "org/tiny@no-such-branch": "has no revision 'no-such-branch'",
      "org/gated": "org/gated is gated: accept its terms at",
  }
  for name, words in cases.items():
    with pytest.raises(HubError) as e:
      load_model(name)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not (served.cache / "models--org--missing").exists()
  assert not [r for r in served.requests if "/cdn/" in r[1] or "/resolve/" in r[1]]


def test_a_gated_repository_loads_with_a_token_and_says_when_the_token_has_no_access(
    served, monkeypatch, tiny_chat_dir):
  monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
  with pytest.raises(HubError, match="the token in HF_TOKEN has no access"):
    load_model("org/gated")
  monkeypatch.setenv("HF_TOKEN", TOKEN)
  _params_equal(load_model("org/gated", dtype="float32"),
                load_model(tiny_chat_dir, dtype="float32"))


def test_no_loadable_weights_names_what_the_repository_has(served):
  served.add("org/noweights", {"config.json": b"{}", "README.md": b"hi", "model.onnx": b"x"})
  with pytest.raises(HubError, match=r"no loadable weights .*model.onnx"):
    load_model("org/noweights")


def test_pickled_weights_are_refused_unless_allowed_then_read_without_code(
    served, tiny_chat_dir, tmp_path):
  import torch

  tensors = load_file(tiny_chat_dir / "model.safetensors")
  torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, tmp_path / "w.bin")
  files = {k: v for k, v in _files(tiny_chat_dir).items() if k != "model.safetensors"}
  files["pytorch_model.bin"] = (tmp_path / "w.bin").read_bytes()
  served.add("org/pickled", files)
  with pytest.raises(HubError, match=r"only pickled PyTorch weights \(pytorch_model.bin\).*"
                     "--allow-bin"):
    load_model("org/pickled")
  assert not [r for r in served.requests if "/cdn/" in r[1]]  # refused before downloading
  _params_equal(load_model("org/pickled", dtype="float32", allow_bin=True),
                load_model(tiny_chat_dir, dtype="float32"))
  # offline, with the pickle in the cache: the remedy is allow_bin, not a download
  from huggingface_hub import constants

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match=r"only pickled PyTorch weights") as e:
      load_model("org/pickled")
    assert "--allow-bin" in str(e.value) and "download it once online" not in str(e.value)

  # a pickle that would run code is refused by weights_only, naming the file
  class Boom:
    def __reduce__(self):
      return (os.system, ("touch " + str(tmp_path / "ran"),))

  torch.save({"x": Boom()}, tmp_path / "evil.bin", _use_new_zipfile_serialization=True)
  files["pytorch_model.bin"] = (tmp_path / "evil.bin").read_bytes()
  served.add("org/evilpickle", files)
  with pytest.raises(Exception, match="not a loadable PyTorch weights file"):
    load_model("org/evilpickle", allow_bin=True)
  assert not (tmp_path / "ran").exists()


def test_a_download_cut_mid_file_is_resumed_from_where_it_stopped(served, monkeypatch,
                                                                   tiny_chat_dir):
  from huggingface_hub import constants

  # the client writes in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB) and resumes from what it has
  # written; the tiny model is smaller than a chunk, so chunks of 4 KiB here
  monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
  served.cut_next(1)
  _params_equal(load_model("org/tiny", dtype="float32"),
                load_model(tiny_chat_dir, dtype="float32"))
  ranges = [rng for meth, p, rng, _ in served.requests if meth == "GET" and "/cdn/" in p]
  assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
  assert int(ranges[1][6:].rstrip("-")) > 0  # from the bytes it had, not from the start


def test_corrupt_bytes_are_caught_by_their_hash_and_removed_from_the_cache(served):
  served.corrupt = True
  with pytest.raises(HubError, match=r"model.safetensors is not the hub's file .*deleted"):
    load_model("org/tiny")
  blobs = list((served.cache / "models--org--tiny" / "blobs").iterdir())
  assert all(len(b.read_bytes()) < 100_000 for b in blobs)  # only the small files are kept
  served.corrupt = False
  assert load_model("org/tiny", dtype="float32").config.vocab_size > 0  # downloaded anew


def test_offline_answers_from_the_cache_or_says_what_is_missing(served, monkeypatch):
  load_model("org/tiny", dtype="float32")  # online once
  from huggingface_hub import constants

  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  n = len(served.requests)
  assert load_model("org/tiny", dtype="float32").config.vocab_size > 0
  assert len(served.requests) == n  # nothing asked of the hub
  with pytest.raises(HubError, match=r"offline \(HF_HUB_OFFLINE\) and org/other@main is not in"):
    load_model("org/other")
  # refs/main naming a commit whose snapshot is gone: said so, not "no config.json"
  import shutil

  shutil.rmtree(served.cache / "models--org--tiny" / "snapshots")
  with pytest.raises(HubError, match=r"the cache's ref names commit [0-9a-f]{12} of org/tiny, "
                                     r"whose files are not in the cache"):
    load_model("org/tiny")


@pytest.mark.parametrize("rev", ["..%2F..%2F..%2Fw%2Fevilref", "..%2Frefs%2Fdev", "..",
                                 "a%2F%2Fb", "refs%2F.hidden", "x" * 256])
def test_a_revision_cannot_leave_the_cache(rev):
  """A revision is checked after %-decoding: no '..', no empty or dot-led part, a length bound
  (refs/<revision> in the cache stays inside refs/)."""
  with pytest.raises(HubError, match=r"is not a branch, tag or commit name"):
    parse_hub_id(f"org/name@{rev}")


@pytest.mark.parametrize("name", ["org/" + "a" * 300, "o" * 300 + "/name"])
def test_names_longer_than_the_hub_allows_are_one_line(name):
  """An organization or repository name over the hub's 96 characters: one line, not the file
  system's "File name too long" from looking for it as a local path."""
  with pytest.raises(HubError, match=r"not a hub id: an organization or repository name has at "
                                     r"most 96 characters, this one 300"):
    load_model(name)


def test_a_planted_ref_that_names_no_commit_is_refused_offline(served, monkeypatch, tmp_path):
  """The cache's ref file names the snapshot: one that does not hold a commit id is refused
  without echoing what it holds, and nothing outside the cache is read."""
  load_model("org/tiny", dtype="float32")  # online once: refs/main and its snapshot
  from huggingface_hub import constants

  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  ref = served.cache / "models--org--tiny" / "refs" / "dev"
  ref.write_text("../../../../secret-dir")
  with pytest.raises(HubError, match=r"org/tiny@dev: the cache's ref .*refs/dev does not hold "
                                     r"a commit id \(40 hex digits; it holds 22 characters\)"
                     ) as e:
    load_model("org/tiny@dev", dtype="float32")
  assert "secret" not in str(e.value)


def test_a_cached_file_whose_bytes_changed_is_refused_online_and_offline(served, monkeypatch):
  """A blob's name is its file's sha256 (LFS) or git blob id: bytes changed after the download
  (bit rot, a bad copy) are caught the first time a process reads them, offline too."""
  from vocabjax.checkpoints import hub

  load_model("org/tiny", dtype="float32")
  link = next((served.cache / "models--org--tiny" / "snapshots").glob("*/model.safetensors"))
  blob = link.resolve()
  assert len(blob.name) in (40, 64)  # hash-named, as huggingface_hub names its blobs
  data = bytearray(blob.read_bytes())
  data[-1] ^= 0xFF
  blob.write_bytes(bytes(data))
  for offline in (False, True):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(HubError, match=r"org/tiny: the cached model.safetensors is not the file "
                                       r"it was downloaded as .*delete .* and load it online"):
      load_model("org/tiny", dtype="float32")
  data[-1] ^= 0xFF  # restored: loads again (checked afresh: its mtime changed)
  blob.write_bytes(bytes(data))
  assert load_model("org/tiny", dtype="float32").config.vocab_size > 0
  assert hub._VERIFIED.get(blob) == hub._stamp(blob)


def test_an_eval_resumed_on_changed_cached_bytes_is_refused_and_mixes_nothing(served, tmp_path):
  """The probe's mixed resume: a suite on a hub-id target, cut after its first records, its
  cached weights bit-flipped, rerun into the same --out. The records' provenance is the commit
  (whose tree names each file's hash) and the cached bytes are checked against those hashes on
  first read, so the rerun is refused in one line and the directory keeps only the records of
  the original weights (before: it resumed, 'match AR 75%' for a lossless method)."""
  import yaml

  from tests.helpers.eval import run_eval
  from vocabjax.eval.runner import RECORDS

  q = tmp_path / "q.jsonl"
  q.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                       for i, t in enumerate(["Who?", "def add(a, b):", "Hello there"])))
  suite = tmp_path / "s.yaml"
  suite.write_text(yaml.safe_dump({
      "name": "hubresume", "target": "org/tiny", "max_new_tokens": 4, "max_len": 64,
      "datasets": [{"kind": "spec_bench", "path": str(q)}],
      "methods": [{"name": "ar", "method": "ar"}, {"name": "pld", "method": "pld", "gamma": 2}]}))
  out = tmp_path / "res"
  run_eval(suite, out, "--reference", "none")
  kept = (out / RECORDS).read_text().splitlines()[:2]
  (out / RECORDS).write_text("".join(x + "\n" for x in kept))
  from vocabjax.checkpoints import hub

  hub._VERIFIED.clear()  # a new process: nothing read yet
  blob = next((served.cache / "models--org--tiny" / "snapshots").glob(
      "*/model.safetensors")).resolve()
  data = bytearray(blob.read_bytes())
  data[-1] ^= 0xFF
  blob.write_bytes(bytes(data))
  with pytest.raises(HubError, match=r"org/tiny: the cached model.safetensors is not the file it "
                                     r"was downloaded as"):
    run_eval(suite, out, "--reference", "none")
  assert (out / RECORDS).read_text().splitlines() == kept


def test_too_little_disk_is_said_before_downloading(served, monkeypatch):
  import shutil
  from collections import namedtuple

  usage = namedtuple("usage", "total used free")
  monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10, 10, 0))
  with pytest.raises(HubError, match=r"GB to download into .* but only 0.00 GB free"):
    load_model("org/tiny")
  assert not [r for r in served.requests if "/cdn/" in r[1]]


def test_a_hub_that_cannot_be_reached_is_one_line_with_the_offline_hint(monkeypatch,
                                                                          tmp_path):
  """The hub client's own network errors (httpx's, not OSErrors: a refused connection) come
  out as one line naming the endpoint and HF_HUB_OFFLINE, through load_model and the command
  line alike."""
  import socket

  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  ep = f"http://127.0.0.1:{port}"
  monkeypatch.setenv("HF_ENDPOINT", ep)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
  from huggingface_hub import constants

  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  with pytest.raises(HubError, match=f"org/tiny: cannot reach {ep} .*HF_HUB_OFFLINE=1 loads "
                                     f"them from there") as e:
    load_model("org/tiny")
  assert "\n" not in str(e.value)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "0"}
  r = subprocess.run([sys.executable, "-m", "vocabjax.generate", "--target", "org/tiny",
                      "--prompt", "hello"], env=env, cwd=tmp_path, capture_output=True,
                     text=True, timeout=600, check=False)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith(f"error: org/tiny: cannot reach {ep}")


@pytest.mark.extended
def test_the_command_line_takes_a_hub_id(served, tmp_path):
  """`python -m vocabjax.generate --target org/tiny` (the code path a Colab runtime takes,
  HF_ENDPOINT pointing at the local hub), and its one-line error for a missing repository."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "0"}
  r = subprocess.run([sys.executable, "-m", "vocabjax.generate", "--target", "org/tiny",
                      "--prompt", "hello", "--max-new-tokens", "4"], env=env,
                     cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "[hub] org/tiny@" in r.stderr and "ar: 4 tokens" in r.stderr
  r = subprocess.run([sys.executable, "-m", "vocabjax.generate", "--target", "org/missing",
                      "--prompt", "hello"], env=env, cwd=tmp_path, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 2, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: org/missing: no repository")
  assert "Traceback" not in r.stderr


@pytest.mark.extended
def test_heads_and_files_by_hub_id_decode_as_their_directories(served, tiny_chat_dir,
                                                                tiny_medusa_dir, tmp_path):
  """An EAGLE head, Medusa heads and a ranker named by hub id (org/name, org/name/path) give
  the outputs of the same files named by path; a ranker named by its repository only (a
  folder) is refused, naming what to write."""
  import jax

  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.errors import ConfigError
  from vocabjax.generate import main, parse_args
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config
  from vocabjax.train.features import model_identity
  from vocabjax.vocab.ranked import svd_ranker

  m = load_model(tiny_chat_dir, dtype="float32")
  hc = head_config(m.config, (0, 1), 40)
  p = init_eagle(jax.random.key(0), hc, scale=0.2)
  p["d2t"] = jax.numpy.asarray(np.arange(0, 120, 3) - np.arange(40))
  head = save_eagle3(p, hc, tmp_path / "head", target=model_identity(m))
  svd_ranker(m.params, m.config, rank=4).save(tmp_path / "r" / "ranker.safetensors")
  served.add("org/eagle-head", _files(head))
  served.add("org/medusa-heads", _files(tiny_medusa_dir))
  served.add("org/ranker", _files(tmp_path / "r"))
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "10", "--quiet"]
  tree = ["--set", "top_k=2", "--set", "depth=3", "--set", "total_tokens=5"]
  for method, local, remote in [
      (["--method", "eagle", *tree], [f"head={head}"], ["head=org/eagle-head"]),
      (["--method", "eagle", *tree, "--set", "lm_head=target", "--set", "k=8"],
       [f"head={head}", f"ranker={tmp_path / 'r' / 'ranker.safetensors'}"],
       ["head=org/eagle-head", "ranker=org/ranker/ranker.safetensors"]),
      (["--method", "medusa"], [f"heads={tiny_medusa_dir}"], ["heads=org/medusa-heads"])]:
    a = main(parse_args(base + method + [x for s in local for x in ("--set", s)]))
    b = main(parse_args(base + method + [x for s in remote for x in ("--set", s)]))
    assert a["output_ids"] == b["output_ids"] and a["speculative"] == b["speculative"], method
  with pytest.raises(ConfigError, match=r"ranker='org/ranker': no such local path, and as a hub "
                     r"id: org/ranker: names a folder; name a file"):
    parse_args(base + ["--method", "eagle", *tree, "--set", "head=org/eagle-head", "--set",
                       "ranker=org/ranker", "--set", "lm_head=target", "--set", "k=8"])
  # offline, a file the cached repository does not hold: named by its id, with no hint to
  # make it with `calibrate select` (it is a download, not a file to make)
  from huggingface_hub import constants

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"org/ranker/subset.npz: offline \(HF_HUB_OFFLINE\) "
                       r"and subset.npz is not among the cached files of org/ranker@") as e:
      parse_args(base + ["--method", "chain", "--draft", str(tiny_chat_dir), "--set",
                         "gamma=2", "--set", "subset=org/ranker/subset.npz"])
    assert "calibrate select" not in str(e.value) and "snapshots" not in str(e.value)


def test_a_gguf_file_by_hub_id(served, tmp_path):
  """org/name/file.gguf: one file of a GGUF repository, downloaded alone and loaded as a .gguf
  path is (the tokenizer from its metadata)."""
  from vocabjax.testing.tiny import tiny_hf_model, tiny_tokenizer, write_tiny_gguf

  tok = tiny_tokenizer(320)
  model = tiny_hf_model("llama", vocab_size=len(tok))
  p = write_tiny_gguf(model, tmp_path / "m-f32.gguf", tokenizer=tok)
  served.add("org/tiny-GGUF", {"m-f32.gguf": p.read_bytes(), "m-q8.gguf": b"x" * 5000})
  a = load_model("org/tiny-GGUF/m-f32.gguf", dtype="float32")
  b = load_model(p, dtype="float32")
  _params_equal(a, b)
  fetched = {r[1].rsplit("/", 1)[1] for r in served.requests if "/resolve/" in r[1]}
  assert fetched == {"m-f32.gguf"}


def _bars(text: str) -> list[str]:
  """The progress output in stderr: the download's line and any tqdm bar."""
  return [ln for ln in text.replace("\r", "\n").splitlines()
          if ln.startswith("[hub]") or "%|" in ln or "it/s]" in ln or "B/s]" in ln]


def _entry_points(tmp_path, tiny_chat_dir, target="org/tiny", extra=()) -> dict:
  """generate, eval, calibrate count and a trainer (Medusa's), each on `target` and (where it
  takes heads) the Medusa heads org/medusa-heads, each with --quiet and `extra` flags: name ->
  run, which returns the exit status (eval: 0 when it returned its summary)."""
  import yaml

  from tests.helpers.train import write_completions
  from vocabjax.calibrate.__main__ import main as calibrate
  from vocabjax.eval import __main__ as ev
  from vocabjax.generate import cli as generate
  from vocabjax.train import medusa

  q = tmp_path / "q.jsonl"
  q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Who?"]}) + "\n")
  suite = tmp_path / "suite.yaml"
  suite.write_text(yaml.safe_dump({
      "name": "quiet", "target": target, "max_new_tokens": 3, "max_len": 64,
      "datasets": [{"kind": "spec_bench", "path": str(q)}],
      "methods": [{"name": "ar", "method": "ar"},
                  {"name": "medusa", "method": "medusa", "heads": "org/medusa-heads"}]}))
  docs = tmp_path / "docs.jsonl"
  docs.write_text("".join(json.dumps({"text": f"def f{i}(x): return x"}) + "\n"
                          for i in range(4)))
  data = write_completions(tiny_chat_dir, tmp_path / "gen.jsonl", n=6, max_new_tokens=6)
  (tmp_path / "m.yaml").write_text(yaml.safe_dump({
      "target": target, "data": [str(data)], "out": str(tmp_path / "m"),
      "features": str(tmp_path / "f"), "feature_layers": [0], "num_heads": 1,
      "train_vocab_size": None, "batch_size": 8, "steps": 2, "warmup_steps": 0,
      "eval_every": 2, "checkpoint_every": 2, "heldout": 0.25}))
  n = iter(range(100))

  def run_eval():
    ev.main(ev.parse_args(["--config", str(suite), "--out", str(tmp_path / f"res{next(n)}"),
                           "--quiet", "--reference", "none", *extra]))
    return 0

  return {
      "generate": lambda: generate([
          "--target", target, "--prompt", "hi", "--max-new-tokens", "3", "--method",
          "medusa", "--set", "heads=org/medusa-heads", "--quiet", *extra]),
      "eval": run_eval,
      "calibrate count": lambda: calibrate([
          "count", "--model", target, "--out", str(tmp_path / f"c{next(n)}"), "--jsonl",
          str(docs), "--quiet", *extra]),
      "train.medusa": lambda: medusa.main([
          "--config", str(tmp_path / "m.yaml"), "--out", str(tmp_path / f"m{next(n)}"),
          "--quiet", *extra]),
  }


@pytest.mark.extended  # offline reaching every entry point stays in the core
def test_quiet_reaches_every_download(served, tiny_chat_dir, tiny_medusa_dir, tmp_path,
                                      monkeypatch, capfd):
  """`--quiet` (and `progress=False` in Python) silences the downloads of models and heads by
  hub id through every entry point: load_model, METHODS[name].make, generate, eval,
  calibrate count and a trainer; without it the same download shows its line and bars (so a
  silent run is the flag's doing). Each case downloads into a cache of its own."""
  from vocabjax.methods import METHODS

  served.add("org/medusa-heads", _files(tiny_medusa_dir))
  monkeypatch.setenv("TQDM_POSITION", "-1")  # huggingface_hub's bars drawn without a terminal
  n = iter(range(100))

  def fresh():
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / f"cache{next(n)}"))
    capfd.readouterr()

  fresh()
  load_model("org/tiny", dtype="float32")
  loud = _bars(capfd.readouterr().err)
  assert any(ln.startswith("[hub] org/tiny@") for ln in loud) and len(loud) > 1, loud
  fresh()
  t = load_model("org/tiny", dtype="float32", progress=False)
  assert _bars(capfd.readouterr().err) == []
  METHODS["medusa"].make(t, None, {"heads": "org/medusa-heads"}, progress=False)
  assert _bars(capfd.readouterr().err) == []
  fresh()
  METHODS["medusa"].make(t, None, {"heads": "org/medusa-heads"})
  assert any(ln.startswith("[hub] org/medusa-heads@") for ln in _bars(capfd.readouterr().err))
  for name, run in _entry_points(tmp_path, tiny_chat_dir).items():
    fresh()
    assert run() == 0, name
    assert _bars(capfd.readouterr().err) == [], name


@pytest.mark.extended
def test_allow_bin_reaches_every_entry_point(served, tiny_chat_dir, tiny_medusa_dir, tmp_path,
                                             monkeypatch):
  """A target with only pickled weights (org/pickled): generate, eval, calibrate count and a
  trainer refuse it without --allow-bin and load it with the flag."""
  import torch

  tensors = load_file(tiny_chat_dir / "model.safetensors")
  torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, tmp_path / "w.bin")
  files = {k: v for k, v in _files(tiny_chat_dir).items() if k != "model.safetensors"}
  files["pytorch_model.bin"] = (tmp_path / "w.bin").read_bytes()
  served.add("org/pickled", files)
  served.add("org/medusa-heads", _files(tiny_medusa_dir))

  def refused(run):
    try:
      return run() != 0
    except Exception as e:  # noqa: BLE001 -- eval raises its one-line errors to its caller
      return "pickled PyTorch weights" in str(e)

  for name, run in _entry_points(tmp_path, tiny_chat_dir, "org/pickled").items():
    monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "0")
    assert refused(run), name
  for name, run in _entry_points(tmp_path, tiny_chat_dir, "org/pickled",
                                 ("--allow-bin",)).items():
    monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "0")  # the flag alone allows it
    assert run() == 0, name


def test_offline_reaches_every_entry_point(served, tiny_chat_dir, tiny_medusa_dir, tmp_path,
                                           monkeypatch, capsys):
  """With HF_HUB_OFFLINE=1, generate, eval, calibrate count and a trainer load the target and
  the heads by hub id from the cache and ask the hub nothing; a repository the cache lacks is
  one line saying so."""
  from huggingface_hub import constants

  from vocabjax.generate import cli as generate
  from vocabjax.methods import local_path

  served.add("org/medusa-heads", _files(tiny_medusa_dir))
  load_model("org/tiny", dtype="float32", progress=False)  # online once
  local_path("org/medusa-heads", "medusa")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  asked = len(served.requests)
  for name, run in _entry_points(tmp_path, tiny_chat_dir).items():
    assert run() == 0, name
  assert len(served.requests) == asked  # nothing asked of the hub
  capsys.readouterr()
  assert generate(["--target", "org/other", "--prompt", "hi", "--quiet"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "offline (HF_HUB_OFFLINE) and org/other@main is not in" in err[0]
