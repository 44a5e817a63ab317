"""docs/extending.md's method in one file, run as the page writes it: importing the file
registers the method (no edit to vocabjax), and it keeps the engine's guarantees, checked with
the helpers every proposer's tests use (`vocabjax.testing.proposers`)."""

import importlib
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from vocabjax.checkpoints.loader import Model
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import METHODS
from vocabjax.models import init_params
from vocabjax.testing.proposers import greedy_identity, target_law

from tests.helpers.models import CFG, SMALL

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"



@pytest.fixture
def my_lookup(tmp_path, monkeypatch):
  """The page's file (its first python block under "## A method in one file"), imported; its
  registration removed afterwards."""
  section = DOC.read_text().split("\n## A method in one file\n", 1)[1]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  (tmp_path / "my_lookup.py").write_text(code)
  monkeypatch.syspath_prepend(str(tmp_path))
  sys.modules.pop("my_lookup", None)
  before = set(METHODS)
  try:
    yield importlib.import_module("my_lookup")
  finally:
    for name in set(METHODS) - before:
      del METHODS[name]
    sys.modules.pop("my_lookup", None)


def test_importing_the_file_registers_the_method(my_lookup):
  method = METHODS["last_token_lookup"]
  assert method.defaults == {"gamma": 4} and not method.needs_draft
  with pytest.raises(ConfigError, match="last_token_lookup.gamma must be >= 1, got 0"):
    method.parse({"gamma": 0}, "my suite")
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  model = Model(config=CFG, params=params, tokenizer=None, eos_token_ids=(), source="tiny",
                dtype=np.float32)
  dec = method.make(model, None, {"gamma": 3})
  assert isinstance(dec, SpeculativeEngine) and dec.proposer.gamma == 3


def test_greedy_output_is_plain_decodings_and_drafts_are_accepted(my_lookup):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  # a prompt holding the target's own greedy continuation of its last token: drafts accepted
  seed = [5, 9, 2]
  greedy = Decoder(params, CFG).generate([seed], max_new_tokens=12).tokens[0]
  prompts = [[*seed, *greedy, *seed], [1, 2, 3, 4], [7]]
  dec = SpeculativeEngine(params, CFG, my_lookup.LastTokenLookup(gamma=3))
  res = greedy_identity(dec, params, CFG, prompts, max_new_tokens=16)
  assert sum(map(sum, res.stats.accepted)) > 0


def test_sampling_follows_the_target_law(my_lookup):
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  dec = SpeculativeEngine(target, SMALL, my_lookup.LastTokenLookup(gamma=2))
  pvalue, stats = target_law(dec, target, SMALL, prompt, SamplingParams(temperature=1.0), seed=7)
  assert 0.05 < stats.acceptance_rate < 0.95  # accepts and rejections both happen
  assert pvalue > 1e-3
