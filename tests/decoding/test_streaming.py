"""`generate(..., streamer=)`: transformers' streamer protocol (`put(ids)`, `end()`) on every
decoder: the prompt first, then each call's kept tokens, then `end()`; what it was given equals
the result's tokens (EOS, stop strings and max_new_tokens cut included)."""

import numpy as np
import pytest

from vocabjax.decoding import Decoder
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer

from tests.helpers.models import CFG, greedy_decoders


class Recorder:
  """A streamer that keeps what it is given."""

  def __init__(self):
    self.puts, self.ends = [], 0

  def put(self, value):
    assert self.ends == 0, "put after end"
    self.puts.append(np.asarray(value).tolist())

  def end(self):
    self.ends += 1


PROMPT = [5, 9, 17, 3, 44, 21, 8, 9, 10, 11, 5, 9, 17]


def _decoders(pair):
  return greedy_decoders(*pair)


@pytest.mark.parametrize("name", ["ar", "chain", "tree", "pld"])
def test_a_streamer_gets_the_prompt_then_the_kept_tokens_then_end(pair, name):
  dec = _decoders(pair)[name]
  rec = Recorder()
  res = dec.generate([PROMPT], max_new_tokens=20, streamer=rec)
  assert rec.puts[0] == [PROMPT] and rec.ends == 1
  streamed = [t for chunk in rec.puts[1:] for t in chunk]
  assert streamed == res.tokens[0] and len(streamed) == 20
  assert all(chunk for chunk in rec.puts[1:])  # no empty puts
  if name in ("chain", "tree"):  # an accepted block arrives at once
    assert len(rec.puts) - 1 < len(streamed)
  # the same tokens as without a streamer
  assert dec.generate([PROMPT], max_new_tokens=20).tokens == res.tokens


def test_the_stream_stops_where_the_output_stops(pair):
  """An EOS inside an accepted block: the streamer gets the tokens up to it, not past it."""
  target, draft = pair
  full = Decoder(target, CFG).generate([PROMPT], max_new_tokens=20).tokens[0]
  eos = full[7]
  rec = Recorder()
  res = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3)).generate(
      [PROMPT], max_new_tokens=20, eos_token_ids=[eos], streamer=rec)
  cut = full[:full.index(eos) + 1]
  assert res.tokens[0] == cut and [t for c in rec.puts[1:] for t in c] == cut
  assert res.finish_reasons == ["eos"] and rec.ends == 1


def test_a_streamer_takes_one_row(pair):
  with pytest.raises(ValueError, match="a streamer takes one row .* this request has 2 rows"):
    Decoder(pair[0], CFG).generate([PROMPT, PROMPT], max_new_tokens=4, streamer=Recorder())


def test_transformers_text_streamer_prints_the_text(capsys):
  """`transformers.TextStreamer(skip_prompt=True)` works as given: it prints the generated
  text (the prompt skipped), the same as decoding the result's tokens."""
  import jax
  from transformers import TextStreamer

  from vocabjax.models import init_params
  from vocabjax.testing.tiny import tiny_tokenizer

  tok = tiny_tokenizer(128)
  config = CFG.replace(vocab_size=len(tok))
  params = init_params(jax.random.key(3), config, scale=0.3)
  prompt = tok.encode("The quick brown fox")
  res = Decoder(params, config).generate([prompt], max_new_tokens=12,
                                         streamer=TextStreamer(tok, skip_prompt=True))
  printed = capsys.readouterr().out
  assert printed.rstrip("\n") == tok.decode(res.tokens[0]) and printed.strip()
