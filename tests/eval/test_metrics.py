"""Aggregated metrics on hand-made records: the end-to-end and the decode-phase speedups."""

import pytest

from vocabjax.eval.metrics import aggregate


def _rec(qid, n, prefill, decode, steps, accepted=0, drafted=0, ids=None):
  return {"qid": qid, "seed": 0, "num_tokens": n, "wall_s": prefill + decode,
          "prefill_s": prefill, "decode_s": decode, "steps": steps, "accepted": accepted,
          "drafted": drafted, "output_ids": ids or [1] * n}


def test_decode_speedup_leaves_prefill_out():
  ar = [_rec("a", 11, 5.0, 10.0, 10), _rec("b", 21, 1.0, 20.0, 20)]
  spec = [_rec("a", 11, 7.0, 5.0, 4, 6, 12), _rec("b", 21, 2.0, 10.0, 7, 13, 21)]
  base = {(r["qid"], 0): r for r in ar}
  got = aggregate(spec, base)
  # end to end: 32 tokens in 24 s against 32 in 36 s; decode: 30 tokens in 15 s against 30 in 30
  assert got["speedup"] == pytest.approx(36 / 24)
  assert got["decode_tokens_per_s"] == pytest.approx(2.0)
  assert got["decode_speedup"] == pytest.approx(2.0)
  assert got["tau"] == pytest.approx((19 + 11) / 11) and got["match_rate"] == 1.0


def test_decode_speedup_absent_without_decode_times():
  ar = [_rec("a", 11, 5.0, 10.0, 10)]
  torch = [{**_rec("a", 11, 0.0, 0.0, None), "wall_s": 12.0, "decode_s": None}]
  got = aggregate(torch, {("a", 0): ar[0]})
  assert got["decode_tokens_per_s"] is None and got["decode_speedup"] is None
  assert got["speedup"] == pytest.approx(15 / 12)


def test_a_capped_instruction_set_is_named_in_the_machine_line(monkeypatch):
  """A run with the CPU kernel built for another target and XLA capped (an AVX2-only host's
  code path on an AVX-512 one) says so beside the CPU's own flags; an uncapped one adds
  nothing."""
  from vocabjax.eval.provenance import cpu_model, isa_cap

  monkeypatch.delenv("VOCABJAX_CPU_MARCH", raising=False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert isa_cap() == "" and "code capped" not in cpu_model()
  monkeypatch.setenv("VOCABJAX_CPU_MARCH", "x86-64-v3")
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=8")
  assert isa_cap() == " (code capped: kernel -march=x86-64-v3, XLA max ISA AVX2)"
  assert cpu_model().endswith(isa_cap())
