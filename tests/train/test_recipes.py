"""Every shipped training recipe (configs/train/) parses as its trainer's job."""

import pytest
import yaml

from vocabjax.prompts import CONFIG_DIR
from vocabjax.train import eagle, ranker
from vocabjax.train.distill.job import job_from_dict as distill_job

RECIPES = sorted((CONFIG_DIR / "train").glob("*.yaml"))
PARSERS = {"ranker": ranker.job_from_dict, "eagle": eagle.job_from_dict, "distill": distill_job}


def test_recipes_are_there():
  assert {p.name.split("_")[0] for p in RECIPES} == set(PARSERS)
  assert not list(CONFIG_DIR.glob("*.yaml"))  # suites in configs/eval/, recipes here


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses(path):
  job = PARSERS[path.name.split("_")[0]](yaml.safe_load(path.read_text()), where=str(path))
  assert str(job.out).startswith("train/results/")
