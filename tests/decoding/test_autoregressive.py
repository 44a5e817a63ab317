"""The autoregressive decoder: stopping, bad requests, no recompilation, sampled distribution."""

import jax
import numpy as np
import pytest
from jax.scipy.stats import chi2

from vocabjax.checkpoints.hf import load_hf
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.models import KVCache, forward, lm_head


@pytest.fixture(scope="module")
def decoder(tiny_dirs):
  config, params, _ = load_hf(tiny_dirs["qwen2_bias"])
  return Decoder(params, config)


def test_eos_stops_only_its_row(decoder):
  prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
  free = decoder.generate(prompts, max_new_tokens=12)
  eos = free.tokens[0][4]  # the 5th greedy token of row 0 becomes the stop token
  first_hit = [row.index(eos) if eos in row else None for row in free.tokens]
  res = decoder.generate(prompts, max_new_tokens=12, eos_token_ids=[eos])
  for row, full, hit in zip(res.tokens, free.tokens, first_hit):
    if hit is None:
      assert row == full
    else:
      assert row == full[:hit + 1]  # EOS included, nothing after it
  assert res.finish_reasons[0] == "eos"


def _scheduled_steps(lengths, rows):
  """Decode steps continuous batching needs: prompts take rows in order as rows free up (lower
  row first), a prompt's first token comes from its prefill and each step adds one."""
  import heapq

  free = [(0, b) for b in range(rows)]
  end = 0
  for n in lengths:
    t, b = heapq.heappop(free)
    end = max(end, t + n - 1)
    heapq.heappush(free, (t + n - 1, b))
  return end


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_continuous_batching_equals_generate(decoder, rows):
  """Rows refilled with the next prompt as theirs finish: each prompt's tokens and finish
  reason are those of one batched `generate`, in prompt order, in exactly the steps the
  schedule needs (no step waits for another prompt's longer answer); a row that idles at the
  end and a prompt done by its prefill's token (max_new_tokens reached) are handled."""
  rs = np.random.RandomState(3)
  prompts = [rs.randint(1, 128, rs.randint(2, 40)).tolist() for _ in range(7)]
  free = decoder.generate(prompts, max_new_tokens=14)
  eos = free.tokens[2][3]  # rows stop at different points
  ref = decoder.generate(prompts, max_new_tokens=14, eos_token_ids=[eos])
  assert len({len(t) for t in ref.tokens}) > 2
  res = decoder.generate_continuous(prompts, rows=rows, max_new_tokens=14, eos_token_ids=[eos])
  assert res.tokens == ref.tokens and res.finish_reasons == ref.finish_reasons
  assert res.prompt_lengths == [len(p) for p in prompts]
  assert res.steps == _scheduled_steps([len(t) for t in ref.tokens], min(rows, len(prompts)))
  if rows == 3:
    assert res.steps < sum(max(len(t) for t in ref.tokens[i:i + 3]) - 1 for i in range(0, 7, 3))
  one = decoder.generate_continuous(prompts, rows=rows, max_new_tokens=1)
  assert one.tokens == [t[:1] for t in free.tokens] and one.steps == 0


def test_continuous_batching_sampled_and_bad_requests(decoder):
  prompts = [[5, 6, 7], [9, 10, 11, 12], [3], [8, 8]]
  hot = SamplingParams(temperature=1.0)
  a = decoder.generate_continuous(prompts, rows=2, max_new_tokens=10, sampling=hot, seed=4)
  b = decoder.generate_continuous(prompts, rows=2, max_new_tokens=10, sampling=hot, seed=4)
  c = decoder.generate_continuous(prompts, rows=2, max_new_tokens=10, sampling=hot, seed=5)
  assert a.tokens == b.tokens and a.tokens != c.tokens
  assert all(len(t) == 10 for t in a.tokens)
  with pytest.raises(ValueError, match="rows=0 must be >= 1"):
    decoder.generate_continuous(prompts, rows=0, max_new_tokens=4)
  with pytest.raises(ValueError, match="exceeds the cache length"):
    decoder.generate_continuous(prompts, rows=2, max_new_tokens=30, max_len=32)


def test_max_new_tokens_and_length_reason(decoder):
  res = decoder.generate([[3, 4]], max_new_tokens=5)
  assert len(res.tokens[0]) == 5 and res.finish_reasons == ["length"] and res.steps == 4
  assert len(decoder.generate([[3, 4]], max_new_tokens=1).tokens[0]) == 1


def test_no_recompilation_across_steps_and_calls(decoder):
  compiles = []

  def listener(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  decoder.generate([[1, 2, 3]], max_new_tokens=6, max_len=64)  # compiles prefill + step
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    res = decoder.generate([[4, 5, 6, 7]], max_new_tokens=40, max_len=64)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert res.steps == 39 and res.compile_s == 0.0
  assert compiles == []


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens must be > 0, got max_new_tokens=0"),
    (dict(max_new_tokens=-3), "max_new_tokens=-3"),
    (dict(max_new_tokens=8, max_len=10), r"prompt of 5 tokens \+ max_new_tokens=8 exceeds the "
                                         r"cache length max_len=10"),
    (dict(max_new_tokens=300), "exceeds the model's context 256"),
    (dict(max_new_tokens=4, sampling=SamplingParams(1.0, 1000)), "top_k=1000 exceeds"),
    (dict(max_new_tokens=2.5), r"max_new_tokens must be an integer, got 2.5 \(float\)"),
    (dict(max_new_tokens=True), r"max_new_tokens must be an integer, got True \(bool\)"),
    (dict(max_new_tokens=4, seed="7"), r"seed must be an integer, got '7' \(str\)"),
    (dict(max_new_tokens=4, seed=2 ** 32), r"seed must lie in \[0, 2\*\*32\)"),
    (dict(max_new_tokens=4, eos_token_ids="28"),
     r"eos_token_ids must be an int or a sequence of ints, got '28' \(str\)"),
    (dict(max_new_tokens=4, eos_token_ids=[2, 1.5]), r"eos_token_ids holds 1.5 \(float\)"),
    (dict(max_new_tokens=4, eos_token_ids=[2, 128, 900]),
     r"eos_token_ids holds ids outside the vocabulary \[0, 128\): \[128, 900\]"),
    # None where the API takes a value: named, not an AttributeError or a TypeError
    (dict(max_new_tokens=None), r"max_new_tokens must be an integer, got None \(NoneType\)"),
    (dict(max_new_tokens=4, seed=None), r"seed must be an integer, got None"),
    (dict(max_new_tokens=4, sampling=None), r"sampling must be a SamplingParams \(SamplingParams"
                                            r"\(\) is greedy\), got None"),
    (dict(max_new_tokens=4, eos_token_ids=None), r"eos_token_ids must be an int or a sequence "
                                                 r"of ints, got None"),
])
def test_bad_requests(decoder, kwargs, match):
  with pytest.raises(ValueError, match=match):
    decoder.generate([[1, 2, 3, 4, 5]], **kwargs)


def test_an_int_eos_id_stops_as_a_list_of_it_does(decoder):
  ref = decoder.generate([[1, 2, 3]], max_new_tokens=12).tokens[0]
  stop = ref[3]
  one = decoder.generate([[1, 2, 3]], max_new_tokens=12, eos_token_ids=stop)
  assert one.tokens == decoder.generate([[1, 2, 3]], max_new_tokens=12,
                                        eos_token_ids=[stop]).tokens
  assert one.tokens[0] == ref[:ref.index(stop) + 1]


def test_bad_prompts(decoder):
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    decoder.generate([[1], []], max_new_tokens=2)
  with pytest.raises(ValueError, match=r"outside \[0, 128\): \[999\]"):
    decoder.generate([[1, 999]], max_new_tokens=2)
  with pytest.raises(ValueError, match="no prompts"):
    decoder.generate([], max_new_tokens=2)


@pytest.mark.parametrize("prompts,match", [
    ([[1.9, 2.5]], r"prompt 0 holds 1.9 \(float\), not an integer token id"),
    (["42"], r"prompt 0 must be a sequence of token ids, got '42' \(str\); tokenize text"),
    ([[1, True]], r"prompt 0 holds True \(bool\)"),
    ([[1], np.asarray([2.0, 3.0])], r"prompt 1 must be a 1-D integer array of token ids, got "
                                    r"float64\[2\]"),
    ("hello", "prompts must be a list of token-id lists, got str"),
])
def test_prompt_ids_are_never_silently_converted(decoder, prompts, match):
  # list(map(int, p)) made [[1.9, 2.5]] into [[1, 2]] and ['42'] into [[4, 2]]
  with pytest.raises(ValueError, match=match):
    decoder.generate(prompts, max_new_tokens=2)


def test_integer_arrays_are_prompts(decoder):
  a = decoder.generate([np.asarray([1, 2, 3], np.int64)], max_new_tokens=2)
  b = decoder.generate([[1, 2, 3]], max_new_tokens=2)
  assert a.tokens == b.tokens


def test_stop_string(tiny_chat_dir):
  model = load_model(tiny_chat_dir)
  dec = Decoder(model.params, model.config)
  prompt = model.tokenizer("def add(a, b):")["input_ids"]
  free = dec.generate([prompt], max_new_tokens=16, tokenizer=model.tokenizer)
  text = model.tokenizer.decode(free.tokens[0][:6])
  stop = text[-2:] if text[-2:].strip() else text[-3:]
  res = dec.generate([prompt], max_new_tokens=16, stop_strings=[stop], tokenizer=model.tokenizer)
  assert res.finish_reasons == ["stop"] and stop in model.tokenizer.decode(res.tokens[0])
  assert len(res.tokens[0]) <= 6 and res.tokens[0] == free.tokens[0][:len(res.tokens[0])]
  with pytest.raises(ValueError, match="stop strings need a tokenizer"):
    dec.generate([prompt], max_new_tokens=4, stop_strings=["x"])
  # the speculative host loop shares the same collector: a stop inside an accepted block
  chain = SpeculativeEngine(model.params, model.config,
                            ChainProposer(model.params, model.config, model.config, gamma=4))
  spec = chain.generate([prompt], max_new_tokens=16, stop_strings=[stop],
                        tokenizer=model.tokenizer)
  assert spec.tokens == res.tokens and spec.finish_reasons == ["stop"]


def test_sampled_first_token_follows_target_distribution(tiny_dirs):
  """4096 rows of one prompt sample independently; chi-square against softmax(logits / T)."""
  config, params, _ = load_hf(tiny_dirs["llama_mha"])
  prompt = [7, 8, 9, 10]
  sp = SamplingParams(temperature=1.5)
  n = 4096
  res = Decoder(params, config).generate([prompt] * n, max_new_tokens=1, sampling=sp, seed=11)
  counts = np.bincount([r[0] for r in res.tokens], minlength=config.vocab_size)
  h, _ = forward(params, np.asarray([prompt]), np.arange(4)[None], KVCache.init(config, 1, 8),
                 config=config)
  z = np.asarray(lm_head(params, h[:, -1], config=config))[0] / 1.5
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  # pool rare tokens so every cell expects >= 5 draws
  order = np.argsort(-probs)
  big = order[probs[order] * n >= 5]
  rest = np.setdiff1d(np.arange(config.vocab_size), big)
  obs, exp = counts[big], probs[big] * n
  if len(rest):
    obs, exp = np.append(obs, counts[rest].sum()), np.append(exp, probs[rest].sum() * n)
  stat = float(((obs - exp) ** 2 / exp).sum())
  assert float(chi2.sf(stat, len(obs) - 1)) > 1e-3
  assert len(set(r[0] for r in res.tokens)) > 10  # really sampling, not greedy


def test_compiled_key_derivation_and_cache_buffers():
  """The host loops' compiled `fold_in` / `split` give jax.random's keys bit for bit (seeded
  sampling reproduces across versions), and `KVCache.init`'s compiled zeros are separate
  buffers (a step donates k and v)."""
  import jax.numpy as jnp

  from vocabjax.decoding import engine
  from tests.helpers.models import CFG

  key = jax.random.key(7)
  for i in (0, 1, 5, 1000, 2**31 - 1):
    np.testing.assert_array_equal(jax.random.key_data(engine.fold_in(key, i)),
                                  jax.random.key_data(jax.random.fold_in(key, i)))
  for n in (2, 3):
    np.testing.assert_array_equal(jax.random.key_data(engine.split(key, n)),
                                  jax.random.key_data(jax.random.split(key, n)))
  c = KVCache.init(CFG, 2, 8, "bfloat16")
  assert c.k.dtype == jnp.bfloat16 and c.lengths.dtype == jnp.int32 and not c.k.any()
  assert c.k.unsafe_buffer_pointer() != c.v.unsafe_buffer_pointer()
