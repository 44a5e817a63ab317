"""`python -m vocabjax.bench tpu`: the deviceless TPU projection on tiny configs (its table's
columns, PROJECTED labels, tau taken from a recorded run, the loop-unrolled cost copy, the
does-not-fit messages with bytes, bad input as one `error:` line and exit 2). Needs libtpu."""

import json

import pytest

from vocabjax.bench import tpu
from vocabjax.bench import stand_ins
from vocabjax.bench import tpu_projection
from vocabjax.bench import tpu_report
from vocabjax.bench.__main__ import main

pytestmark = pytest.mark.integration  # compiles for TPU / GPU (.ci/run's second step)

GATE = "eval/results/eagle/gate"  # a recorded eval run (summary.json with tau per method)
HBM_V5E = 16 * 2**30


def _config(path, **kw):
  raw = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1e6,
             max_position_embeddings=4096, vocab_size=4096, tie_word_embeddings=True,
             num_attention_heads=4, num_key_value_heads=4, head_dim=64, hidden_size=256,
             intermediate_size=512, num_hidden_layers=2)
  raw.update(kw)
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(raw))
  return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  root = tmp_path_factory.mktemp("configs")
  return _config(root / "target"), _config(root / "draft", num_hidden_layers=1)


@pytest.fixture(scope="module")
def projected(tiny, tmp_path_factory):
  out = tmp_path_factory.mktemp("tpu")
  rc = main(["tpu", "--topology", "v5e:1x1", "--target", tiny[0], "--draft", tiny[1],
             "--out", str(out), "--run", GATE, "--methods", "chain_g3", "pld_g4",
             "--context", "256"])
  assert rc == 0
  return json.loads((out / "tpu.json").read_text()), (out / "tpu.md").read_text()


def test_rows_hold_memory_costs_and_projected_speedups(projected):
  result, _ = projected
  rows = {r["method"]: r for r in result["rows"]}
  assert list(rows) == ["ar", "chain_g3", "pld_g4"]  # ar first: every speedup is against it
  assert result["chip"]["hbm_bytes"] == HBM_V5E and result["mesh"] is None
  for r in rows.values():
    assert "error" not in r, r.get("error")
    assert r["fits"] and r["total_bytes"] <= r["hbm_bytes"]
    assert r["weights_bytes"] > 0 and r["kv_bytes"] > 0 and r["temp_bytes"] >= 0
    assert r["total_bytes"] >= r["weights_bytes"] + r["kv_bytes"]
    # the largest cache that fits, from the cache's bytes per slot (no sliding layers here: no
    # fixed-size ring)
    assert r["kv_ring_bytes"] == 0
    assert r["max_cache_slots"] == int((r["hbm_bytes"] - (r["total_bytes"] - r["kv_bytes"]))
                                       // r["kv_bytes_per_slot"])
    assert r["flops"] > 0 and r["bytes_accessed"] > 0
    # the roofline reads XLA's HBM count (prefetches off), at most its count as compiled
    assert 0 < r["hbm_bytes_accessed"] <= r["bytes_accessed"]
    assert r["roofline_s"] == pytest.approx(max(r["flops"] / 197e12,
                                                r["hbm_bytes_accessed"] / 819e9))
    assert r["args_floor_s"] == pytest.approx((r["weights_bytes"] + r["kv_bytes"]) / 819e9)
    assert r["stream_s"] == pytest.approx(max(r["flops"] / 197e12, r["stream_bytes"] / 819e9))
  # costs of the chain come from its loop-unrolled copy; PLD's step has no loop
  assert rows["chain_g3"]["cost_programs"] == ["cost:step"]
  assert rows["pld_g4"]["cost_programs"] == ["step"]
  # tau from the run: by name, or by registry method and step parameters (PLD's n-gram bound
  # is host-only: pld_g4_n2's step is pld_g4's)
  assert (rows["chain_g3"]["tau"], rows["chain_g3"]["tau_from"]) == (3.0, "chain_g3")
  assert rows["pld_g4"]["tau_from"] == "pld_g4_n2"
  for name in ("chain_g3", "pld_g4"):
    r = rows[name]
    assert r["projected_speedup"] == pytest.approx(
        r["tau"] * rows["ar"]["roofline_s"] / r["roofline_s"])
    assert r["stream_speedup"] == pytest.approx(
        r["tau"] * rows["ar"]["stream_s"] / r["stream_s"])
  assert rows["ar"]["projected_speedup"] == rows["ar"]["stream_speedup"] == 1.0
  assert (rows["chain_g3"]["drafter_passes"], rows["pld_g4"]["drafter_passes"]) == (3, 0)


def test_cache_bytes_count_a_sliding_layers_ring_once():
  """Gemma 3's sliding layers keep a ring of W + RING_SLACK slots past their window: the
  projection's cache bytes are those of the cache `KVCache.init` makes, and only the global
  layers' buffers grow with the slots (what max_cache_slots divides by)."""
  import jax.numpy as jnp

  from vocabjax.models.cache import RING_SLACK, KVCache
  from vocabjax.models.config import LlamaLikeConfig

  cfg = LlamaLikeConfig(arch="gemma3", vocab_size=64, hidden_size=32, intermediate_size=48,
                        num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8,
                        hidden_act="gelu_tanh", norm_unit_offset=True, sandwich_norms=True,
                        scale_embeddings=True, sliding_window=16,
                        layer_types=("sliding_attention",) * 5 + ("full_attention",))
  per = 2 * 8 * 4  # KV heads x head_dim x f32 bytes, per slot, row and layer
  for S, ring in ((64, None), (2048, 16 + RING_SLACK)):
    cache = KVCache.init(cfg, 3, S)
    assert cache.ring == ring
    want = 2 * 3 * per * (6 * S if ring is None else S + 5 * ring)  # k and v
    assert tpu.kv_bytes_per_chip(cfg, 3, S, jnp.float32, None) == want == cache.nbytes()
    assert tpu.cache_bytes(cache) == want
    grow = tpu.cache_bytes(cache, ring=False)
    assert grow == 2 * 3 * per * S * (6 if ring is None else 1)
    assert want - grow == (0 if ring is None else 2 * 3 * per * 5 * ring)


def test_markdown_labels_every_time_projected_and_says_what_it_cannot_see(projected):
  result, md = projected
  for col in ("weights + inputs GiB", "KV GiB", "temps GiB", "total GiB (HBM)", "fits",
              "max cache slots", "GFLOP", "GB accessed (XLA, as compiled)",
              "GB to and from HBM", "HBM bytes / bytes to read", "PROJECTED roofline time us",
              "PROJECTED floor us (arguments read once)", "bound", "tau", "PROJECTED speedup",
              "GB streamed (model)", "PROJECTED weight-stream time us",
              "PROJECTED speedup (weight-stream)"):
    assert f"| {col} |" in md, col
  table = [l for l in md.splitlines() if l.startswith(("| ar ", "| chain_g3 ", "| pld_g4 "))]
  assert len(table) == 3
  for line in table:  # every time and speedup cell says PROJECTED
    cells = line.split("|")
    assert all(cells[i].strip().startswith("PROJECTED") for i in (13, 14, 18, 20, 21)), line
  assert "3.00 |" in table[1] and "(pld_g4_n2)" in table[2]
  assert result["command"].startswith("python -m vocabjax.bench tpu --topology v5e:1x1")
  assert f"`{result['command']}`" in md
  assert f"jax {result['jax']}, libtpu {result['libtpu']}" in md and result["date"] in md
  assert "Nothing here ran on a TPU" in md
  for seen in ("Pallas kernels", "Launch and dispatch overhead", "host loop",
               "counts a loop body once"):
    assert seen in md, seen


def test_unrolled_copy_counts_every_drafting_call(tiny):
  from vocabjax.bench.shapes import resolve_config

  setup = stand_ins.Setup(resolve_config(tiny[0])[1], resolve_config(tiny[1])[1])
  step = tpu.lower_step("chain_g3", setup, S=128, costs=True, compile=True)
  rolled, unrolled = (step.programs[n].compiled.cost_analysis()["flops"]
                      for n in ("step", "cost:step"))
  assert step.cost_programs == ("cost:step",)
  assert unrolled > rolled  # the scan's second drafting call is counted too


def test_weight_stream_model_counts_each_drafting_pass(tiny):
  import jax

  from vocabjax.bench.shapes import resolve_config

  setup = stand_ins.Setup(resolve_config(tiny[0])[1], resolve_config(tiny[1])[1])
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa
  kv = lambda c: nbytes([c.k, c.v])  # noqa: E731
  ar = tpu.lower_step("ar", setup, S=128)  # lowered only: the model needs no compile
  assert tpu_projection.stream_bytes(stand_ins.method_spec("ar"),
                                     ar) == nbytes(ar.decoder.params) + kv(ar.caches[0])
  chain = tpu.lower_step("chain_g3", setup, S=128)
  d = chain.decoder
  assert tpu_projection.drafter_passes(stand_ins.method_spec("chain_g3"),
                                       d) == 3  # [prev, last], then 2
  tcache, dcache = chain.caches
  # tied models: the embedding is the LM head, streamed with the target once, the drafter 3x
  assert tpu_projection.stream_bytes(stand_ins.method_spec("chain_g3"), chain) == (
      nbytes(d.target_params) + kv(tcache) + 3 * (nbytes(d.proposer_params) + kv(dcache)))
  trim = tpu.lower_step("vocabtrim_k1024_g3", setup, S=128)
  d = trim.decoder
  # a trimmed head: its 1024 rows per pass instead of the drafter's [V, D] head
  assert tpu_projection.stream_bytes(
      stand_ins.method_spec("vocabtrim_k1024_g3"),
      trim) == (nbytes(d.target_params) + kv(tcache) + 3 *
                (nbytes(d.proposer_params) - nbytes(d.proposer_params["embed"]) + kv(dcache)))


def test_tau_matching_against_the_gate_run():
  entries = tpu_projection.run_methods(GATE)
  got = {m: (tpu_projection.match_tau(stand_ins.method_spec(m), entries) or {}).get("name")
         for m in stand_ins.METHODS}
  assert got == {"ar": "ar", "chain_g3": "chain_g3", "tree_k4d4n16": "tree_k4d4n16",
                 "eagle_k1d4": "eagle_k1d4", "eagle_k4d4n16": "eagle_k4d4n16",
                 "pld_g4": "pld_g4_n2", "medusa_h3k2": None, "vocabtrim_k8192_g3": None,
                 "sv2048_g3_tpu": None, "crossvocab_g4": None}
  # a gated EAGLE (min_confidence 0.2) runs another step program: not matched to the ungated
  gated = [e for e in entries if e["name"] == "eagle_k4d4n16_c0.2"]
  assert tpu_projection.match_tau(stand_ins.method_spec("eagle_k4d4n16"), gated) is None


def test_a_target_too_big_for_one_chip_is_an_error_with_bytes(tmp_path, capsys):
  # weights of a 32 GB target (two [1M, 8192] bf16 tables) on one 16 GiB v5e
  big = _config(tmp_path / "big", vocab_size=1_000_000, hidden_size=8192, intermediate_size=64,
                num_hidden_layers=1, tie_word_embeddings=False, num_attention_heads=64,
                num_key_value_heads=8, head_dim=128)
  rc = main(["tpu", "--topology", "v5e:1x1", "--target", big, "--draft", big,
             "--out", str(tmp_path / "out")])
  assert rc == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: big ("), err
  assert "does not fit v5e:1x1 (one chip)" in err[0]
  assert f"> {HBM_V5E:,} bytes (16.00 GiB) of HBM per TPU v5e chip" in err[0]
  assert "of weights per chip" in err[0] and "try v5e:2x2 (4 chips)" in err[0]
  assert not (tmp_path / "out" / "tpu.json").exists()


def test_a_method_that_does_not_fit_is_a_row_with_needed_and_available_bytes(tmp_path):
  # a 9.8 GB target fits a 16 GiB chip alone; with a drafter as large it does not
  cfg = _config(tmp_path / "t", vocab_size=600_000, hidden_size=8192, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=64, num_key_value_heads=8,
                head_dim=128)
  out = tmp_path / "out"
  rc = main(["tpu", "--topology", "v5e:1x1", "--target", cfg, "--draft", cfg, "--out",
             str(out), "--methods", "chain_g3", "--context", "64", "--rolled-costs"])
  assert rc == 0
  rows = {r["method"]: r for r in json.loads((out / "tpu.json").read_text())["rows"]}
  assert rows["ar"]["fits"] is True
  chain = rows["chain_g3"]
  assert chain["fits"] is False and chain["hbm_bytes"] == HBM_V5E
  assert chain["needed_bytes"] > HBM_V5E
  md = (out / "tpu.md").read_text()
  assert f"no: {chain['needed_bytes']:,} > {HBM_V5E:,} bytes" in md
  assert "does not fit: needs" in md and "try v5e:2x2 (4 chips)" in md


@pytest.mark.parametrize("args,message", [
    (["--topology", "v9z:1x1"], "error: unknown TPU topology 'v9z:1x1'"),
    (["--topology", "v5e:1x1", "--methods", "tree_k4"], "error: unknown method 'tree_k4'"),
    (["--topology", "v5e:1x1", "--run", "no/such/run"], "error: --run no/such/run: no "
     "summary.json there"),
    (["--topology", "v5e:1x1", "--paper", "frspec-llama3", "--pair", "qwen2.5-coder"],
     "error: --paper names the models, methods and tau"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capfd, args, message):
  rc = main(["tpu", *args, "--out", str(tmp_path / "out")])
  assert rc == 2
  err = capfd.readouterr().err.strip().splitlines()  # libtpu's own log lines kept off stderr
  assert len(err) == 1 and err[0].startswith(message), err


def test_methods_are_the_registrys_names_and_parameters(tiny):
  """The bench speaks the registry, as `python -m vocabjax.generate --method NAME --set k=v`
  does: every registered method by name (its defaults), parameters as NAME:key=value, the
  registry's own checks; a short name is an alias whose program is the registry form's."""
  from vocabjax.bench.shapes import resolve_config
  from vocabjax.methods import METHODS as REGISTRY

  for name, m in REGISTRY.items():  # required values given as generate's --set would
    need = [f"{k}=64" for k, t in m.fields.items() if k not in m.defaults and t is not str]
    if name == "covtrim":  # its step is VocabTrim's, whose K its file holds: said, not guessed
      with pytest.raises(ValueError, match="covtrim.*step is VocabTrim's.*vocabtrim:k=K"):
        stand_ins.method_spec(name)
      continue
    spec = stand_ins.method_spec(name + (":" + ",".join(need) if need else ""))
    assert spec.kind == name
  assert stand_ins.method_spec("chain:gamma=3").params == stand_ins.method_spec("chain_g3").params
  with pytest.raises(ValueError, match=r"method 'chain' has no parameters \['gama'\]"):
    stand_ins.method_spec("chain:gama=3")
  with pytest.raises(ValueError, match="chain needs 1 <= gamma.*got gamma=0"):
    stand_ins.method_spec("chain:gamma=0")
  with pytest.raises(ValueError, match=r"min_token_prob must lie in \[0, 1\], got 2"):
    stand_ins.method_spec("suffix:min_token_prob=2")
  setup = stand_ins.Setup(resolve_config(tiny[0])[1], resolve_config(tiny[1])[1])
  texts = [tpu.lower_step(m, setup, S=128).programs["step"].text
           for m in ("chain_g3", "chain:gamma=3")]
  assert texts[0] == texts[1]
  # the proposers the short names never had compile for a TPU chip as they are
  for m in ("suffix:max_spec_tokens=4", "ngram:gamma=3"):
    step = tpu.lower_step(m, setup, S=128, compile=True)
    assert step.programs["step"].compiled.memory_analysis().alias_size_in_bytes > 0, m


def test_papers_pairs_name_published_heads_and_taus():
  """Every paper's row is a method the bench compiles, its tau the paper's own figure (mean of
  the published table's columns) or none, and its target a known config."""
  from vocabjax.bench.papers import PAPER_PAIRS
  from vocabjax.bench.shapes import resolve_config
  from vocabjax.eval import published

  assert set(PAPER_PAIRS) == {"frspec-llama3", "eagle3-llama31", "specvocab-qwen3",
                              "dflash-qwen3"}
  for pair in PAPER_PAIRS.values():
    cfg = resolve_config(pair.target)[1]
    assert cfg.hidden_size == 4096 and cfg.vocab_size in (128256, 151936)
    for row in pair.rows:
      kind = "dflash" if pair.head_kind == "dflash" else "eagle"
      assert stand_ins.method_spec(row.method).kind == kind
      assert row.source  # where tau comes from, or why there is none
  df = PAPER_PAIRS["dflash-qwen3"]
  taus = [t for _, t in published.DFLASH_TABLE1["dflash_b16"]]
  assert df.rows[0].tau == pytest.approx(sum(taus) / 7, abs=0.01) == 6.49
  assert df.head_layers == 5 and max(df.head_layer_ids) < resolve_config(df.target)[1].num_layers
  assert [r.tau for r in df.rows[1:]] == [None] * 3
  fr = {r.label: r for r in PAPER_PAIRS["frspec-llama3"].rows}
  full = fr["EAGLE-2 (full vocabulary)"]
  assert full.tau == pytest.approx(sum(published.FRSPEC_TAU["full"]) / 7, abs=1e-3)
  assert fr["FR-Spec 8K"].tau == pytest.approx(sum(published.FRSPEC_TAU["8k"]) / 7, abs=1e-3)
  assert fr["FR-Spec 8K"].method == full.method + "|subset_k=8192"
  assert stand_ins.method_spec(fr["FR-Spec 8K"].method).params["subset_k"] == 8192
  e3 = PAPER_PAIRS["eagle3-llama31"]
  assert e3.head_vocab == 32000 and e3.rows[0].tau == 6.23 and e3.rows[1].tau is None
  sv = {r.label: r.tau for r in PAPER_PAIRS["specvocab-qwen3"].rows}
  assert sv["SpecVocab k=2048"] > sv["EAGLE-3 (32K head)"]


def test_published_tau_gives_projected_speedups_for_an_eagle2_head_and_its_subsets(tiny):
  """A paper's pair in small: an EAGLE-1/2 head over the target's LM head, restricted to a
  static subset (`|subset_k=K`), projected with published taus instead of a run's."""
  from vocabjax.bench.shapes import resolve_config

  tc = resolve_config(tiny[0])[1]
  setup = stand_ins.Setup(tc, tc, head_kind="eagle2", head_intermediate=128, has_drafter=False)
  tree = "eagle:top_k=2,depth=2,total_tokens=4"
  sub = tree + "|subset_k=1024"
  taus = {tree: (3.0, "paper A, Table 1"), sub: (2.5, "paper A, Table 1")}
  result = tpu_projection.project(setup, "v5e:1x1", ["ar", tree, sub], S=128, unrolled_costs=False,
                       taus=taus, labels={tree: "full head", sub: "1K subset"},
                       paper="paper A on a tiny pair")
  rows = {r["method"]: r for r in result["rows"]}
  assert result["setup"]["eagle_head"] == {"kind": "eagle2", "draft_vocab": 4096,
                                           "intermediate": 128}
  for m, (tau, _) in taus.items():
    r = rows[m]
    assert "error" not in r, r.get("error")
    assert r["tau"] == tau and r["tau_from"] == "published" and r["tau_source"]
    assert r["projected_speedup"] == pytest.approx(tau * rows["ar"]["roofline_s"]
                                                   / r["roofline_s"])
  # the subset's head reads 1,024 of the 4,096 rows per drafting pass
  assert rows[sub]["stream_bytes"] < rows[tree]["stream_bytes"]
  md = tpu_report.render(result)
  assert "tau: PUBLISHED, from the paper" in md and "paper A on a tiny pair" in md
  assert f"| 1K subset (`{sub}`) |" in md and "tau: paper A, Table 1" in md
  assert "EAGLE head (eagle2) Vd=4096" in md and ", no drafter model," in md
  assert "crossvocab drafter" not in md and tpu_report.PAPER_TAU_CAVEAT in md
  assert "tau comes from the recorded run" not in md
  with pytest.raises(ValueError, match="subset_k and policy restrict a full LM head"):
    tpu.build_decoder(tree + "|subset_k=8", stand_ins.Setup(tc, tc, head_vocab=64),
                      device=tpu.devices_of("v5e:1x1")[0])


def test_published_tau_gives_projected_speedups_for_a_dflash_drafter_and_its_subsets(tiny):
  """DFlash's pair in small: a paper's drafter of two layers reading named target layers,
  drafting through the target's head or a static subset of it, projected with a published tau;
  the report names the drafter, not an EAGLE head."""
  from vocabjax.bench.shapes import resolve_config

  tc = resolve_config(tiny[0])[1]
  setup = stand_ins.Setup(tc, tc, head_kind="dflash", head_intermediate=96, head_layers=2,
                          head_layer_ids=(0, 1), has_drafter=False)
  sub = "dflash|block=4;subset_k=512"
  taus = {"dflash|block=4": (3.5, "paper B, Table 1")}
  result = tpu_projection.project(setup, "v5e:1x1", ["ar", "dflash|block=4", sub], S=128,
                                  unrolled_costs=False, taus=taus, paper="paper B in small")
  rows = {r["method"]: r for r in result["rows"]}
  assert result["setup"]["dflash_drafter"] == {"layers": 2, "target_layer_ids": [0, 1],
                                               "intermediate": 96}
  full = rows["dflash|block=4"]
  assert "error" not in full and "error" not in rows[sub], (full.get("error"),
                                                             rows[sub].get("error"))
  assert full["tau"] == 3.5 and full["projected_speedup"] == pytest.approx(
      3.5 * rows["ar"]["roofline_s"] / full["roofline_s"])
  assert rows[sub]["stream_bytes"] < full["stream_bytes"]  # 512 of the head's rows
  # the fit check before compiling counts what the decoder holds once, whatever a lowered
  # step left in its caches (the engine's loop-state shapes hold its params again)
  dec = tpu.build_decoder(sub, setup, device=tpu.devices_of("v5e:1x1")[0])
  before = tpu_projection._weight_bytes_per_chip(dec)
  tpu.lower_step(sub, setup, topology="v5e:1x1", S=128, decoder=dec, costs=False)
  assert tpu_projection._weight_bytes_per_chip(dec) == before
  md = tpu_report.render(result)
  assert "DFlash drafter of 2 layers (intermediate 96) reading target layers [0, 1]" in md
  assert "EAGLE head" not in md
  with pytest.raises(ValueError, match="a DFlash drafter"):
    stand_ins.abstract_head_config(setup)


def test_kernel_bytes_count_every_position_an_eagle_tree_puts_through_the_ranked_head(tiny):
  """SpecVocab over an EAGLE head: the indexed head's uncounted reads are k rows (in pairs in
  bf16) per position each drafting level puts through the head: 1 + top_k x (depth - 1)."""
  from vocabjax.bench.shapes import resolve_config

  tc = resolve_config(tiny[0])[1]
  setup = stand_ins.Setup(tc, tc, head_vocab=64, head_intermediate=128, ranker_rank=8)
  name = "eagle:top_k=2,depth=3,total_tokens=6,lm_head=target,ranker=x,k=64"
  dec = tpu.build_decoder(name, setup, device=tpu.devices_of("v5e:1x1")[0])
  positions = 1 + 2 * (3 - 1)
  assert tpu_projection.pallas_bytes(stand_ins.method_spec(name), setup, 1,
                                     dec) == positions * 64 * 2 * 256 * 2
  plain = "eagle:top_k=2,depth=3,total_tokens=6,lm_head=target"
  assert tpu_projection.pallas_bytes(stand_ins.method_spec(plain), setup, 1,
                           tpu.build_decoder(plain, setup,
                                             device=tpu.devices_of("v5e:1x1")[0])) is None


def test_on_a_slice_heads_and_subsets_are_split_as_the_target(tiny):
  """On a TPU slice (the [out, in] MLP layout of an accelerator) an EAGLE head's decoder layer
  is split by the target's layer rules and a trimmed head's rows by rows: replicated, each chip
  streamed all of them on every drafting call (v5e:2x2, Llama-3-8B: FR-Spec's 64K subset read
  more per chip than the 128K head it trims; eval/results/tpu_papers)."""
  from jax.sharding import PartitionSpec as P

  from vocabjax.bench.shapes import resolve_config
  from vocabjax.vocab.policy import policy_state

  tc = resolve_config(tiny[0])[1]
  setup = stand_ins.Setup(tc, tc, head_vocab=64, head_intermediate=128)
  mesh = tpu.tpu_mesh("v5e:2x2")
  dec = tpu.build_decoder("eagle:top_k=2,depth=2,total_tokens=4,lm_head=target|subset_k=1024",
                          setup, mesh=mesh)
  spec = {k: v.sharding.spec for k, v in dec.proposer_params["eagle"]["layer"].items()}
  assert spec["wq"] == spec["w_up"] == spec["w_gate"] == P("model", None)
  assert spec["wo"] == spec["w_down"] == P(None, "model")
  assert spec["attn_norm"] == P(None)
  assert policy_state(dec.proposer_params)["head"].sharding.spec == P("model", None)
  chain = tpu.build_decoder("vocabtrim:k=1024,gamma=2", setup, mesh=mesh)
  assert policy_state(chain.proposer_params)["head"].sharding.spec == P("model", None)


@pytest.mark.parametrize("weights", ["", "int8"])
@pytest.mark.parametrize("topology", ["v5e:1x1", "v6e:2x2"])
def test_hbm_bytes_of_plain_chain_and_tree_steps_stay_within_a_fifth_of_what_they_must_read(
    topology, weights):
  """XLA's HBM count of plain, chain and tree steps (prefetches off, `tpu.HBM_COST_OPTIONS`)
  over what they must read (the weight-stream model): at most 1.2, bf16 and int8 weights, one
  chip and a slice; the count as compiled counts VMEM prefetches again. Exception: the int8
  tree on a slice, 1.22 at these sizes (its excess grows with the cache slots, from attention
  and cache traffic that these small layers do not outweigh; docs/tpu.md, 'Bytes')."""
  import dataclasses

  # real vocabulary and Qwen2.5-0.5B's layers: weights dominate as in a real model's step
  setup = dataclasses.replace(tpu_projection.matrix_setup(), weights=weights)
  result = tpu_projection.project(setup, topology, ["ar", "chain_g3", "tree_k2d2n4"], S=256)
  rows = {r["method"]: r for r in result["rows"]}
  chip = tpu.chip_of(topology)
  for name, r in rows.items():
    assert "error" not in r, r.get("error")
    assert r["hbm_bytes_accessed"] <= r["bytes_accessed"], name
    bound = 1.25 if (weights, topology, name) == ("int8", "v6e:2x2", "tree_k2d2n4") else 1.2
    assert 0.8 <= r["bytes_ratio"] <= bound, (name, r["bytes_ratio"])
    # the roofline reads the HBM count
    assert r["roofline_s"] == pytest.approx(max(r["flops"] / chip.bf16_flops_per_s,
                                                r["hbm_bytes_accessed"] / chip.hbm_bytes_per_s))
  md = tpu_report.render(result)
  assert "HBM bytes / bytes to read" in md and f"{rows['ar']['bytes_ratio']:.2f}" in md


def test_a_method_that_refuses_the_setup_is_an_error_row_not_a_crash(tiny):
  from vocabjax.bench.shapes import resolve_config

  setup = stand_ins.Setup(resolve_config(tiny[0])[1], resolve_config(tiny[1])[1], weights="int8")
  result = tpu_projection.project(setup, "v5e:1x1", ["ar", "eagle_k1d2"], S=128)
  rows = {r["method"]: r for r in result["rows"]}
  assert "error" not in rows["ar"] and rows["ar"]["bytes_ratio"] > 0
  assert "int8 target" in rows["eagle_k1d2"]["error"], rows["eagle_k1d2"]
  assert "error:" in tpu_report.render(result)
