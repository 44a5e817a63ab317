"""The drafters' reference implementations from PyPI, for the tests that check vocabjax's heads
against them on the same weights:

    python -m vocabjax.testing.references install      # once (pip, --no-deps, ~2 MB)
    Model, EConfig = eagle1_head()                      # EAGLE's cnets.Model (EAGLE-1/2 heads)
    Eagle3 = eagle3_head()                              # SpecForge's LlamaForCausalLMEagle3
    ResBlock, utils = medusa_reference()                # Medusa's ResBlock and tree utilities
    _C = suffix_reference()                             # Arctic Inference's C++ suffix tree
    model = dflash_reference()                          # z-lab's dflash.model (DFlash drafters)
    speculators = speculators_reference()               # vLLM's speculators (its formats)

`eagle-llm` 1.2.1, `medusa-llm` 0.1, `specforge` 0.2.0 (the one EAGLE-3 head on PyPI), `dflash`
0.1.0 and `speculators` 0.9.0 pin dependencies that clash with this environment's while their
model code runs on it, so they are installed without dependencies into their own folder
(`~/.cache/vocabjax/references/`, `VOCABJAX_REFERENCES_DIR` moves it), put on `sys.path` only by
the functions here (`speculators` with the few pure-Python packages its import chain needs,
`SPECULATORS_IMPORTS`). None carries EAGLE-2's dynamic tree or Medusa's sparse trees.
`eagle1_config` restores the transformers-4 view of `rope_theta` the EAGLE code reads.
`arctic-inference` 0.3.0 has no wheel here: only its suffix tree is built, from the source
distribution's `csrc/suffix_decoding` (nanobind, CMake and Ninja from PyPI, the system's C++20
compiler), with its `cache.py` beside it."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

from vocabjax.testing.gpu_aot import pip_install_into

PACKAGES = {"eagle-llm": ("1.2.1", "eagle"), "medusa-llm": ("0.1", "medusa"),
            "specforge": ("0.2.0", "specforge"), "dflash": ("0.1.0", "dflash"),
            "speculators": ("0.9.0", "speculators")}
# what `import speculators` needs beside this environment (installed into its folder, no deps)
SPECULATORS_IMPORTS = ("loguru==0.7.3", "pydantic-settings==2.16.3", "python-dotenv==1.2.4",
                       "openai==3.57.0", "jiter==0.19.0", "distro==1.9.0", "httpx==0.29.0",
                       "httpcore==1.0.9", "sniffio==1.3.1", "hs-connectors==0.9.0")
EXTRA = {"speculators": SPECULATORS_IMPORTS}


def references_dir() -> Path:
  base = os.environ.get("VOCABJAX_REFERENCES_DIR") or (
      Path.home() / ".cache" / "vocabjax" / "references")
  return Path(base)


def _target(name: str) -> Path:
  version, _ = PACKAGES[name]
  return references_dir() / f"{name}-{version}"


def installed(name: str) -> bool:
  return (_target(name) / PACKAGES[name][1]).is_dir()


def install(force: bool = False) -> None:
  """pip install --no-deps each reference into its folder (through a temporary one: an
  interrupted install leaves nothing half-written)."""
  for name, (version, module) in PACKAGES.items():
    final = _target(name)
    if installed(name) and not force:
      print(f"[references] {name}=={version} is in {final}")
      continue
    pip_install_into(
        final, lambda d, n=name, v=version: [
            sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
            "--target", str(d), f"{n}=={v}", *EXTRA.get(n, ())],
        lambda d, m=module: (d / m).is_dir(), f"{name}=={version}",
        "the reference comparison tests need it", tag="references")
  try:
    install_arctic(force)
  except RuntimeError as e:  # no C++20 compiler or Python headers: the other references stay
    _arctic_dir().parent.mkdir(parents=True, exist_ok=True)
    (_arctic_dir().parent / "arctic-build-error.txt").write_text(str(e))
    print(f"[references] {e}", file=sys.stderr)


ARCTIC = ("arctic-inference", "0.3.0", "nanobind==2.9.2")


def _arctic_dir() -> Path:
  return references_dir() / f"{ARCTIC[0]}-{ARCTIC[1]}"


def arctic_installed() -> bool:
  return any((_arctic_dir() / "arctic_inference" / "suffix_decoding").glob("_C*.so"))


def install_arctic(force: bool = False) -> None:
  """Build Arctic Inference's suffix tree extension from its PyPI source distribution into its
  folder (through a temporary one: an interrupted build leaves nothing half-written)."""
  import glob
  import shutil
  import subprocess
  import tarfile

  final = _arctic_dir()
  if arctic_installed() and not force:
    print(f"[references] {ARCTIC[0]}=={ARCTIC[1]} (suffix tree) is in {final}")
    return
  tmp = final.with_name(final.name + f".partial-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tools = tmp / "tools"
  pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]

  def run(cmd, **kw):
    print("[references] " + " ".join(map(str, cmd)), flush=True)
    try:
      subprocess.run(list(map(str, cmd)), check=True, **kw)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
      raise RuntimeError(f"building {ARCTIC[0]}=={ARCTIC[1]}'s suffix tree failed at "
                         f"{cmd[0]} ({e}); the SuffixDecoding reference test needs it") from None

  try:
    run(pip + ["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               "-d", tmp / "sdist", f"{ARCTIC[0]}=={ARCTIC[1]}"])
    run(pip + ["install", "--no-deps", "--target", tools, ARCTIC[2], "cmake", "ninja"])
    src = tmp / "src"
    with tarfile.open(next((tmp / "sdist").glob("*.tar.gz"))) as tar:
      try:
        tar.extractall(src, filter="data")
      except TypeError:  # Python < 3.11.4: no extraction filters (PyPI's own sdist)
        tar.extractall(src)
    root = next(src.iterdir())
    env = {**os.environ, "PYTHONPATH": str(tools)}
    exe = lambda name: next(iter(glob.glob(str(tools / "bin" / name))), name)  # noqa: E731
    build = tmp / "build"
    run([exe("cmake"), "-S", root / "csrc" / "suffix_decoding", "-B", build, "-G", "Ninja",
         f"-DCMAKE_MAKE_PROGRAM={exe('ninja')}", f"-DPython_EXECUTABLE={sys.executable}",
         "-DCMAKE_BUILD_TYPE=Release"], env=env)
    run([exe("cmake"), "--build", build], env=env)
    pkg = tmp / "arctic_inference" / "suffix_decoding"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    for name in ("__init__.py", "cache.py"):
      shutil.copy(root / "arctic_inference" / "suffix_decoding" / name, pkg / name)
    for so in build.glob("_C*.so"):
      shutil.copy(so, pkg / so.name)
    for junk in ("sdist", "src", "build", "tools"):
      shutil.rmtree(tmp / junk)
    if final.exists():
      shutil.rmtree(final)
    os.replace(tmp, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  if not arctic_installed():
    raise RuntimeError(f"the build left no suffix tree extension in {final}")
  (final.parent / "arctic-build-error.txt").unlink(missing_ok=True)
  print(f"[references] built {ARCTIC[0]}=={ARCTIC[1]}'s suffix tree in {final}")


@functools.cache
def suffix_reference():
  """Arctic Inference's suffix tree module (`_C`: `SuffixTree(max_depth)`, `.extend(seq_id,
  tokens)`, `.remove(seq_id)`, `.speculate(context, max_spec_tokens, max_spec_factor,
  max_spec_offset, min_token_prob, use_tree_spec)` -> a Draft of token_ids, parents, probs,
  score, match_len), or RuntimeError saying how to build it (CI must not skip)."""
  if not arctic_installed():
    why = _arctic_dir().parent / "arctic-build-error.txt"
    raise RuntimeError(f"the SuffixDecoding reference ({ARCTIC[0]}=={ARCTIC[1]}'s suffix tree) "
                       f"is not in {_arctic_dir()}: run `python -m vocabjax.testing install`"
                       + (f" (its last build failed: {why.read_text()})" if why.is_file()
                          else ""))
  path = str(_arctic_dir())
  if path not in sys.path:
    sys.path.insert(0, path)
  return importlib.import_module("arctic_inference.suffix_decoding._C")


def _require(name: str) -> None:
  """Put the reference on sys.path, or raise saying how to install it (CI must not skip)."""
  if not installed(name):
    raise RuntimeError(f"the reference implementation {name}=={PACKAGES[name][0]} is not in "
                       f"{_target(name)}: run `python -m vocabjax.testing.references install`")
  path = str(_target(name))
  if path not in sys.path:
    sys.path.insert(0, path)


@functools.cache
def eagle1_head():
  """(cnets.Model, configs.EConfig) of EAGLE's PyPI release."""
  _require("eagle-llm")
  cnets = importlib.import_module("eagle.model.cnets")
  configs = importlib.import_module("eagle.model.configs")
  return cnets.Model, configs.EConfig


def eagle1_config(raw: dict):
  """An EConfig of `raw` (a head's config.json) as transformers 4 exposed it to EAGLE's code:
  `rope_scaling` as written (None or {"type", "factor"}) and `rope_theta` an attribute."""
  _, EConfig = eagle1_head()
  with tempfile.TemporaryDirectory() as d:
    (Path(d) / "config.json").write_text(json.dumps(raw))
    c = EConfig.from_pretrained(d)
  c.rope_scaling = raw.get("rope_scaling")
  if "rope_theta" in raw:
    c.rope_theta = raw["rope_theta"]
  return c


@functools.cache
def eagle3_head():
  """SpecForge's `LlamaForCausalLMEagle3` (build it with a transformers `LlamaConfig` carrying
  `draft_vocab_size`, `attention_backend="sdpa"`; its forward: `embed_input_ids`,
  `project_hidden_states` (fc), `backbone`, `compute_logits`)."""
  _require("specforge")
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "flash_attn is not found": the CPU uses sdpa
    module = importlib.import_module("specforge.modeling.draft.llama3_eagle")
  return module.LlamaForCausalLMEagle3


@functools.cache
def medusa_reference():
  """(medusa_model.ResBlock, medusa.model.utils) of Medusa's PyPI release."""
  _require("medusa-llm")
  import transformers.utils as tu

  if not hasattr(tu, "is_flash_attn_available"):  # removed in transformers 5; its KV model
    tu.is_flash_attn_available = lambda: False  # module imports it (unused on the CPU)
  model = importlib.import_module("medusa.model.medusa_model")
  utils = importlib.import_module("medusa.model.utils")
  return model.ResBlock, utils


@functools.cache
def dflash_reference():
  """z-lab's `dflash.model` of its PyPI release (`DFlashDraftModel`, `DFlash2DraftModel`,
  `dflash_generate`, `extract_context_feature`); it runs on this environment's torch and
  transformers (its `local` extra pins torch 2.13.0 and transformers 5.15.0)."""
  _require("dflash")
  return importlib.import_module("dflash.model")


def speculators_reference():
  """vLLM's `speculators` package of its PyPI release (with `SPECULATORS_IMPORTS` beside it)."""
  _require("speculators")
  return importlib.import_module("speculators")


def main(argv=None) -> int:
  import argparse

  p = argparse.ArgumentParser(prog="python -m vocabjax.testing.references",
                              description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  i = sub.add_parser("install", help="install the reference implementations (--no-deps)")
  i.add_argument("--force", action="store_true", help="reinstall")
  a = p.parse_args(argv)
  install(force=a.force)
  return 0


if __name__ == "__main__":
  sys.exit(main())
