"""Every shipped training recipe (configs/train/) parses as its trainer's job."""

import pytest
import yaml

from vocabjax.prompts import CONFIG_DIR
from vocabjax.train import dflash, eagle, medusa, ranker, router
from vocabjax.train.distill.job import job_from_dict as distill_job

RECIPES = sorted((CONFIG_DIR / "train").rglob("*.yaml"))
PARSERS = {"ranker": ranker.job_from_dict, "eagle": eagle.job_from_dict,
           "medusa": medusa.job_from_dict, "distill": distill_job,
           "dflash": dflash.job_from_dict, "router": router.job_from_dict}


def kind(path) -> str:
  """The trainer of a recipe: its name's first word, or its folder's (eagle_ablation/...)."""
  named = path if path.parent == CONFIG_DIR / "train" else path.parent
  return named.name.split("_")[0]


def test_recipes_are_there():
  assert {kind(p) for p in RECIPES} == set(PARSERS)
  assert any(p.parent.name == "eagle_ablation" for p in RECIPES)
  assert not list(CONFIG_DIR.glob("*.yaml"))  # suites in configs/eval/, recipes here


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses(path):
  job = PARSERS[kind(path)](yaml.safe_load(path.read_text()), where=str(path))
  assert str(job.out).startswith("train/")


def test_the_medusa_recipe_names_the_eagle_mix_shards():
  """One feature pass serves both: the Medusa recipe's shards are the EAGLE mix recipe's."""
  e = eagle.job_from_dict(yaml.safe_load((CONFIG_DIR / "train" / "eagle_qwen15b_mix.yaml")
                                         .read_text()))
  m = medusa.job_from_dict(yaml.safe_load((CONFIG_DIR / "train" / "medusa_qwen15b.yaml")
                                          .read_text()))
  layers = (1, 13, 24)
  assert e.final_hidden and m.eagle_job.features_dir == e.features_dir
  assert m.eagle_job.feature_fingerprint(layers) == e.feature_fingerprint(layers)


def test_the_dflash_recipe_names_the_eagle_chat_shards():
  """The DFlash recipe reads the features the chat EAGLE head trains on (same target, data,
  layers and final hidden states): one feature pass serves both."""
  e = eagle.job_from_dict(yaml.safe_load((CONFIG_DIR / "train" / "eagle_qwen15b_chat_pl.yaml")
                                         .read_text()))
  d = dflash.job_from_dict(yaml.safe_load((CONFIG_DIR / "train" / "dflash_qwen15b_chat.yaml")
                                          .read_text()))
  layers = d.target_layer_ids
  assert layers == (1, 13, 24)
  fj = d.feature_job(layers)
  assert fj.features_dir == e.features_dir
  assert fj.feature_fingerprint(layers) == e.feature_fingerprint(layers)
