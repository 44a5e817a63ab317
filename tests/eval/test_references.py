"""The trimmed references shipped with the package (vocabjax/eval/references/), which a suite's
run is set beside by default: each reads, names a suite that ships, and equals the trimmed copy
of the recorded run it names."""

import json
from pathlib import Path

import pytest

from vocabjax.eval import report

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(report.REFERENCE_ROOT.glob("*.json"))


def test_the_default_suite_has_a_shipped_reference():
  assert report.REFERENCE_ROOT / "default.json" in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_reference_is_the_trimmed_recorded_run(path):
  ref = report.load_reference(path)
  assert ref["reference_of"] == path.stem
  assert (ROOT / "configs" / "eval" / f"{path.stem}.yaml").is_file()
  recorded = ROOT / ref["source"] / "summary.json"
  assert recorded.is_file(), ref["source"]
  assert ref == report.trim_reference(json.loads(recorded.read_text()), ref["source"])


def test_a_trimmed_reference_missing_a_field_is_refused(tmp_path):
  bad = tmp_path / "x.json"
  bad.write_text(json.dumps({"reference_of": "x", "source": "s", "methods": {}}))
  with pytest.raises(ValueError, match="fingerprint"):
    report.load_reference(bad)
