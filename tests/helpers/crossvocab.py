"""The cross-vocabulary pair the tests share: two tiny models with two trained byte-level BPE
tokenizers (`crossvocab_pair`), prompts, and the merged-draft sampling check (`merging_law`)."""

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.testing.stats import chi2_pvalue, exact_support_probs
from vocabjax.testing.tiny import tiny_tokenizer
from vocabjax.vocab.translate import build_vocab_map

DRAFT_CORPUS = [
    "The lazy dog sleeps while the quick fox runs.", "def mul(a, b):\n    return a * b\n",
    "Bonjour le monde, comment allez-vous ?", "print('hello world')"
] * 20


TEXTS = ["def add(a, b):\n", "The quick brown fox", "Hello world! How"]


def config(V, arch="qwen2"):
  return LlamaLikeConfig(arch=arch, vocab_size=V, hidden_size=32, intermediate_size=48,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         attention_bias=arch == "qwen2", max_position_embeddings=2048)


def crossvocab_pair():
  """Target (V=400, tokenizer A) and a drafter (V=320, tokenizer B trained on other text) that
  is the target's copy through the vocabulary intersection plus noise: they agree often:
  (target tokenizer, drafter tokenizer, target config, drafter config, target, drafter)."""
  ttok, dtok = tiny_tokenizer(400), tiny_tokenizer(320, corpus=DRAFT_CORPUS)
  tc, dc = config(len(ttok)), config(len(dtok), arch="qwen2")
  target = init_params(jax.random.key(0), tc, scale=0.3)
  vm = build_vocab_map(dtok, ttok)
  noise = init_params(jax.random.key(1), dc, scale=0.3)
  rows = np.where(vm.d2t >= 0, vm.d2t, 0)
  draft = jax.tree.map(lambda a: a, target)
  for name in ("embed", "lm_head"):
    draft[name] = jnp.where(jnp.asarray(vm.d2t >= 0)[:, None], target[name][rows],
                            noise[name]) + 0.3 * noise[name]
  draft["layers"] = jax.tree.map(lambda a, b: a + 0.3 * b, target["layers"], noise["layers"])
  return ttok, dtok, tc, dc, target, draft


def prompts(ttok):
  return [ttok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def merging_law(merging, rule, sp, rows, batch, seed=0, mesh=None, continuous=False):
  """(p-value of the first three tokens against target-only sampling, merged drafts accepted
  per row) with `rows` samples, `batch` prompts per generate call (on `mesh` if given;
  `continuous`: one call, `batch` cache rows decoding them in turn)."""
  ttok, dtok, tc, dc, target, draft, pool = merging
  dec = SpeculativeEngine(
      target, tc,
      CrossVocabProposer(draft, dc, tc, target_tokenizer=ttok, draft_tokenizer=dtok, gamma=4,
                         rule=rule), mesh=mesh)
  dec.proposer.learn(pool)
  prompt = pool[:2]
  toks, merged = [], 0
  for call in range(rows // batch):
    if continuous:
      res = dec.generate_continuous([prompt] * rows, rows=batch, max_new_tokens=3, sampling=sp,
                                    seed=seed)
    else:
      res = dec.generate([prompt] * batch, max_new_tokens=3, sampling=sp, seed=seed + call)
    toks += [tuple(t[:3]) for t in res.tokens]
    merged += sum(map(sum, res.stats.ngram_accepted))
    if continuous:
      break
  law = exact_support_probs(target, tc, prompt, sp, n_tokens=3)
  cells = {s: i for i, s in enumerate(law)}
  assert all(s in cells for s in toks), "a sequence outside the target's support was emitted"
  return chi2_pvalue(np.asarray([cells[s] for s in toks]), np.asarray(list(law.values()))), \
      merged / len(toks)
