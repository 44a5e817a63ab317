"""The registry's methods as decoders over abstract stand-ins of a pair's shapes: what the
deviceless compiles (`vocabjax.bench.tpu`) build. A method is named as the registry names it,
"NAME" (its defaults) or "NAME:key=value,..." (`python -m vocabjax.generate --method NAME --set
key=value`), or by a short alias of the recorded tables; its parameters are parsed and checked
by the registry's own dataclasses, and the files it would read (heads, rankers, counts,
subsets, corpora) are stand-ins of the `Setup`'s shapes (module doc of `vocabjax.bench.tpu`)."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.hybrid import HostTreeHybrid, LookupTrie
from vocabjax.decoding.medusa import MedusaProposer, medusa_choices_for
from vocabjax.decoding.peagle import PEagleProposer
from vocabjax.methods.ngram import NgramProposer, NgramTable
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.errors import ConfigError
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.dflash import DFlashConfig, init_dflash
from vocabjax.models.eagle import EagleConfig, init_eagle, training_feature_layers
from vocabjax.models.llamalike import FINAL_NORMED, init_params, quantize_grouped, quantize_int8
from vocabjax.models.medusa import MedusaConfig, init_medusa
from vocabjax.vocab.clustered import ClusteredVocab, ClusterRouter
from vocabjax.vocab.incontext import InContextVocab
from vocabjax.vocab.lowrank import LowRankHead
from vocabjax.vocab.ranked import Ranker, SpeculativeVocab
from vocabjax.vocab.subset import VocabSubset

# --- what is compiled --------------------------------------------------------------------------

WEIGHTS = ("", "int8", "int4")  # Setup.weights: the dtype's own, weight-only int8, or grouped
#   int4 (`quantize_grouped`: Q4_0's values as int4 codes and f32 group scales)


@dataclasses.dataclass(frozen=True)
class Setup:
  """The models of a comparison (configs only, no weights) and the shapes of the heads."""

  target: LlamaLikeConfig
  draft: LlamaLikeConfig  # the same-vocabulary drafter (chain, tree, VocabTrim, SpecVocab)
  cross_draft: LlamaLikeConfig | None = None  # crossvocab's drafter (default: `draft`)
  dtype: str = "bfloat16"  # weights and KV caches
  weights: str = ""  # "int8": the target's and drafters' matrices as per-row int8 (`quantize_int8`
  #   of `dtype` weights; norms, activations and caches stay `dtype`; heads stay `dtype`);
  #   "int4": as grouped int4 (`quantize_grouped`)
  head_vocab: int = 8192  # EAGLE head's Vd (the chat_pl head of eval/results/eagle/gate)
  head_intermediate: int = 2048
  head_kind: str = "eagle3"  # or "eagle2": an EAGLE-1/2 head (the target's final normed
  #   feature, drafting over the target's LM head: its Vd is the target's V); or "dflash": a
  #   paper's DFlash drafter (`head_layers`, `head_layer_ids`), no EAGLE head
  head_layers: int = 1  # the DFlash drafter's layers
  head_layer_ids: tuple[int, ...] | None = None  # the target layers it reads (None: low/mid/last)
  ranker_rank: int = 128  # SpecVocab ranker rank d'
  target_name: str = "target"
  draft_name: str = "draft"
  cross_draft_name: str = ""
  has_drafter: bool = True  # False: `draft` only stands in (a paper's pair: heads alone)

  def __post_init__(self):
    if self.head_kind not in ("eagle2", "eagle3", "dflash"):
      raise ValueError(f"head_kind={self.head_kind!r}: 'eagle2', 'eagle3' or 'dflash'")
    if self.weights not in WEIGHTS:
      raise ValueError(f"weights={self.weights!r}: choose one of {WEIGHTS} ('' keeps `dtype`)")
    if self.target.vocab_size != self.draft.vocab_size:
      raise ValueError(f"target V={self.target.vocab_size} and drafter V="
                       f"{self.draft.vocab_size} differ: pass a same-vocabulary drafter as "
                       f"`draft` and the other one as `cross_draft`")

  @property
  def crossvocab_draft(self) -> LlamaLikeConfig:
    return self.cross_draft or self.draft

  def describe(self) -> str:
    def c(cfg):
      return f"L{cfg.num_layers} D{cfg.hidden_size} V{cfg.vocab_size}"
    out = f"target {c(self.target)}" + (f", drafter {c(self.draft)}" if self.has_drafter
                                          else ", no drafter model")
    if self.cross_draft is not None:
      out += f", crossvocab drafter {c(self.cross_draft)}"
    return f"{out}, {self.dtype}" + (f" ({self.weights} weights)" if self.weights else "")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """A method name parsed (`method_spec`)."""

  name: str
  kind: str  # the registry's method (vocabjax.methods.METHODS) whose step this is
  params: dict | None  # its step-shaping registry parameters (a run's tau is matched on them;
  #   None: by name only)
  needs: tuple  # abstract models the decoder takes: "target", "draft", "head", ...
  build: Callable  # (arrays, setup, mesh) -> decoder
  about: str
  while_trips: int = 0  # iterations of the step's while_loop (crossvocab drafting), for costs
  loop_programs: tuple = ("step",)  # the step programs that hold the loops

  @property
  def loops(self) -> bool:
    """Whether the step holds a scan or while loop (XLA's cost analysis counts a body once)."""
    return self.kind in ("chain", "tree", "tree_suffix", "eagle", "eagle_pld", "eagle_suffix",
                         "vocabtrim",
                         "frspec", "specvocab", "microspec", "slimspec", "dynaspec",
                         "evospec", "crossvocab")


# the methods `lower_step` and `python -m vocabjax.bench tpu` take: the registry's names and
# parameters, as `python -m vocabjax.generate --method NAME --set key=value` takes them, written
# "NAME" (its defaults) or "NAME:key=value,key=value" (e.g. "tree:top_k=4,depth=4,total_tokens=16");
# files a method reads (heads, rankers, counts, subsets, corpora) are stand-ins of the Setup's
# shapes. The defaults are the shapes of eval/results/eagle/gate's methods (and SpecVocab's
# main setting), under their short names: aliases of registry forms (ALIASES), which the recorded
# runs and tables use.
METHODS = ("ar", "chain_g3", "tree_k4d4n16", "eagle_k1d4", "eagle_k4d4n16", "medusa_h3k2",
           "pld_g4", "vocabtrim_k8192_g3", "sv2048_g3_tpu", "crossvocab_g4")
NAME_FORMS = ("NAME", "NAME:key=value,...", "ar", "chain_g<G>", "tree_k<k>d<d>n<n>",
              "eagle_k<k>d<d>[n<n>]", "medusa_h<H>k<k>", "pld_g<G>", "vocabtrim_k<K>_g<G>",
              "frspec_k<K>_g<G>", "sv<K>_g<G>_<tpu|gpu|xla|auto>", "crossvocab_g<G>")
ALIASES = [  # short name -> registry form (and bench-only settings: SpecVocab's kernel impl)
    (re.compile(r"chain_g(\d+)"), lambda g: "chain:gamma={}".format(*g)),
    (re.compile(r"tree_k(\d+)d(\d+)n(\d+)"),
     lambda g: "tree:top_k={},depth={},total_tokens={}".format(*g)),
    (re.compile(r"eagle_k(\d+)d(\d+)(?:n(\d+))?"), lambda g: "eagle:top_k={},depth={},"
     "total_tokens={}".format(g[0], g[1], g[2] or int(g[0]) * int(g[1]))),
    (re.compile(r"medusa_h(\d+)k(\d+)"), lambda g: "medusa:depth={},top_k={}".format(*g)),
    (re.compile(r"pld_g(\d+)"), lambda g: "pld:gamma={}".format(*g)),
    (re.compile(r"vocabtrim_k(\d+)_g(\d+)"), lambda g: "vocabtrim:k={},gamma={}".format(*g)),
    (re.compile(r"frspec_k(\d+)_g(\d+)"), lambda g: "frspec:k={},gamma={}".format(*g)),
    (re.compile(r"sv(\d+)_g(\d+)_(tpu|gpu|xla|auto)"),
     lambda g: "specvocab:k={},gamma={}|impl={}".format(*g)),
    (re.compile(r"crossvocab_g(\d+)"), lambda g: "crossvocab:gamma={}".format(*g)),
]


# registry parameters that never change a step program (host-side lookup, file paths; an EAGLE
# head's or a ranker's shapes are taken as the Setup's)
HOST_ONLY = {"min_ngram", "max_ngram", "head", "ranker", "subset", "counts", "drafter",
             "index", "router", "factors",
              "self_sizing",
              "ngram", "rule", "choices", "heads", "threshold", "corpus", "n",
              "max_tree_depth", "max_cached_requests", "min_token_prob", "max_spec_factor",
              "max_spec_offset"}
_STAND_IN = "<bench stand-in>"  # what a file parameter holds here (never read)


def registry_form(name: str) -> tuple[str, dict, dict]:
  """(registry method, its parameters as given, bench-only settings) of a method name: "NAME",
  "NAME:key=value,...", or a short alias (ALIASES); ValueError naming it otherwise."""
  from vocabjax.methods import METHODS as REGISTRY  # local: the registry's parsers
  from vocabjax.methods.vocab import parse_settings  # local: as the registry

  for form, to in ALIASES:
    m = form.fullmatch(name)
    if m:
      name = to(m.groups())
      break
  name, _, extra = name.partition("|")
  kind, _, given = name.partition(":")
  if kind not in REGISTRY:
    raise ValueError(f"unknown method {kind!r}: the registry's {sorted(REGISTRY)}, as NAME or "
                     f"NAME:key=value,... (or a short name: {', '.join(NAME_FORMS[2:])})")
  try:
    raw = parse_settings(given, f"method {name!r}")
  except ConfigError as e:
    raise ValueError(str(e)) from None
  bench = dict(kv.split("=", 1) for kv in filter(None, extra.split(";")))
  return kind, raw, bench


def method_spec(name: str) -> MethodSpec:
  """The method a name says (`registry_form`), its parameters parsed by the registry's own
  dataclass (defaults filled, types checked; files are stand-ins); ValueError naming the name
  and the problem otherwise."""
  from vocabjax.methods import METHODS as REGISTRY  # local: the registry's parsers

  kind, raw, bench = registry_form(name)
  method = REGISTRY[kind]
  for field, typ in method.fields.items():  # a file the step does not read: a stand-in
    if typ is str and field not in method.defaults and field not in raw:
      raw[field] = _STAND_IN
  try:
    p = method.parse(raw, f"method {name!r}", check_files=False)
    p.check(f"method {name!r}")  # the values' checks (a stand-in file's are not this one's)
  except ConfigError as e:
    if _STAND_IN not in str(e):
      raise ValueError(str(e)) from None
  try:
    return _SPECS[kind](name, kind, p, bench)
  except ValueError as e:
    raise ValueError(f"method {name!r}: {e}") from None


def _shaping(kind: str, p) -> dict:
  """The registry parameters of `p` that shape the step program (a run's tau is matched on
  them)."""
  return {k: v for k, v in dataclasses.asdict(p).items() if k not in HOST_ONLY}


def _draft_vocab(s: Setup, kind: str, p, bench: dict):
  """A stand-in vocabulary policy of the parameters' size over the drafter (`k`)."""
  if kind in ("vocabtrim", "frspec"):
    if not 1 <= p.k <= s.draft.vocab_size:
      raise ValueError(f"subset K={p.k} must be in [1, V={s.draft.vocab_size}]")
    # the subset's ids only fix K: which K rows are copied does not change the program
    return VocabSubset(np.arange(p.k), s.draft.vocab_size, meta=(("ids", "stand-in"),))
  if kind == "specvocab":
    impl = {"xla": "reference"}.get(bench.get("impl", "auto"), bench.get("impl", "auto"))
    return _ranker_vocab(s, p.k, impl)
  if kind == "microspec":  # the core's ids and the rows' tokens are values, not shapes
    return InContextVocab(VocabSubset(np.arange(p.core), s.draft.vocab_size,
                                      meta=(("ids", "stand-in"),)), window=p.window)
  if kind == "evospec":  # a successor index of `|successors=n` per token (default 4)
    V, n = s.draft.vocab_size, int(bench.get("successors", 4))
    return InContextVocab(VocabSubset(np.arange(p.base), V, meta=(("ids", "stand-in"),)),
                          window=p.window,
                          successors=np.full((V, n), -1, np.int32) if n else None)
  if kind == "slimspec":
    return LowRankHead(_ranker_vocab(s, 1, "auto").ranker)
  if kind == "dynaspec":
    return ClusteredVocab(_router_stand_in(s, int(bench.get("clusters", 64))), p.top)
  return None


class _ShapeRouter(ClusterRouter):
  """A router for abstract drafter weights: only its shapes are checked (as `_ShapeRanker`)."""

  def check_drafter(self, params, config) -> None:
    if (self.vocab_size, self.weight.shape[1]) != (config.vocab_size, config.hidden_size):
      raise ValueError(f"router made for V={self.vocab_size}, D={self.weight.shape[1]}; the "
                       f"drafter has V={config.vocab_size}, D={config.hidden_size}")


def _router_stand_in(s: Setup, C: int) -> ClusterRouter:
  """C clusters of consecutive ids over the drafter's vocabulary, a zero router (the bench
  setting `|clusters=C`, default 64: DynaSpec's count is not published)."""
  V, D = s.draft.vocab_size, s.draft.hidden_size
  M = -(-V // C)
  members = np.full(C * M, -1, np.int32)
  members[:V] = np.arange(V)
  return _ShapeRouter(members.reshape(C, M), np.zeros((C, D), np.float32),
                      np.zeros(C, np.float32), {"hidden_size": D, "vocab_size": V,
                                                "fingerprint": "abstract"})


def _tree_of(p) -> TreeParams | None:
  return TreeParams(p.top_k, p.depth, p.total_tokens) if getattr(p, "depth", 0) else None


def _model_spec(name, kind, p, bench):
  """chain, tree and the drafter vocabularies (a chain, or a tree where depth > 0)."""
  if getattr(p, "subset", ""):
    raise ValueError("a saved subset is read for its size: name it as vocabtrim:k=K")

  def build(a, s, mesh):
    vocab = _draft_vocab(s, kind, p, bench)
    tree = _tree_of(p) if kind != "chain" else None
    if kind == "tree_suffix":
      if mesh is not None:
        raise ValueError("tree_suffix runs on one device")
      return SpeculativeEngine(
          a["target"], s.target,
          HostTreeHybrid(TreeProposer(a["draft"], s.draft, s.target, tree=tree),
                         p.host_tree()))
    if kind == "tree" or tree is not None:
      return SpeculativeEngine(
          a["target"], s.target,
          TreeProposer(a["draft"], s.draft, s.target, tree=tree, draft_vocab=vocab), mesh=mesh)
    return SpeculativeEngine(
        a["target"], s.target,
        ChainProposer(a["draft"], s.draft, s.target, gamma=p.gamma, draft_vocab=vocab), mesh=mesh)

  shape = (f"tree of {p.total_tokens} nodes" if kind in ("tree", "tree_suffix")
           or _tree_of(p) is not None
           else f"chain of {p.gamma}")
  about = {"chain": "drafter", "tree": "drafter", "tree_suffix": "drafter + SuffixDecoding",
           "vocabtrim": f"static subset of {getattr(p, 'k', 0)} rows (VocabTrim and FR-Spec run "
                        f"the same program)",
           "frspec": f"static subset of {getattr(p, 'k', 0)} rows (VocabTrim and FR-Spec run "
                     f"the same program)",
           "specvocab": f"SpecVocab top-{getattr(p, 'k', 0)} (a rank-R ranker, indexed head "
                        f"impl={bench.get('impl', 'auto')!r})",
           "microspec": f"MicroSpec core {getattr(p, 'core', 0)} + {getattr(p, 'window', 0)} "
                        f"in-context slots a row",
           "slimspec": "SlimSpec low-rank head (rank R of the setup's ranker)",
           "evospec": f"EvoSpec base {getattr(p, 'base', 0)} + {getattr(p, 'window', 0)} "
                      f"evolving slots a row ({bench.get('successors', 4)} successors a token)",
           "dynaspec": f"DynaSpec top {getattr(p, 'top', 0)} of "
                       f"{bench.get('clusters', 64)} clusters"}[kind]
  return MethodSpec(name, kind, _shaping(kind, p), ("target", "draft"), build,
                    f"{about}, {shape}")


def _bench_subset_k(kind: str, p, bench: dict, example: str) -> int:
  """A head's static subset as a bench setting (`|subset_k=K`, 0: none): a saved subset file is
  read for its size alone, so it is refused; a subset and a ranker both are too."""
  if p.subset:
    raise ValueError(f"a saved subset is read for its size: give its size as the bench setting "
                     f"`|subset_k=K` (e.g. {example})")
  subset_k = int(bench.get("subset_k", 0))
  if subset_k and p.ranker:
    raise ValueError(f"{kind} takes a subset or a ranker, not both")
  return subset_k


def _subset_stand_in(subset_k: int, V: int) -> VocabSubset:
  """A stand-in static subset of K rows of a V-row head (which rows does not change the
  program)."""
  if not 1 <= subset_k <= V:
    raise ValueError(f"subset_k={subset_k} must be in [1, V={V}]")
  return VocabSubset(np.arange(subset_k), V, meta=(("ids", "stand-in"),))


def _head_policy_stand_in(policy: str, bench: dict, s: Setup):
  """A newer policy over a head's full-vocabulary LM head (the target's V rows of width D), of
  the bench settings' sizes: `|policy=microspec;core=C;window=W`, `policy=evospec;base=B;
  window=W[;successors=n]`, `policy=dynaspec;top=m[;clusters=C]`, `policy=slimspec[;rank=R]`."""
  V = s.target.vocab_size
  num = lambda key, default: int(bench.get(key, default))  # noqa: E731
  if policy == "microspec":
    return InContextVocab(_subset_stand_in(num("core", 512), V), window=num("window", 2560))
  if policy == "evospec":
    n = num("successors", 4)
    return InContextVocab(_subset_stand_in(num("base", 8192), V), window=num("window", 1024),
                          successors=np.full((V, n), -1, np.int32) if n else None)
  shape = s.target  # the head's policy is attached over the target's head (its config)
  if policy == "dynaspec":
    return ClusteredVocab(_router_stand_in(dataclasses.replace(s, draft=shape),
                                           num("clusters", 64)), num("top", 4))
  if policy == "slimspec":
    return LowRankHead(_ranker_vocab(dataclasses.replace(s, ranker_rank=num(
        "rank", s.ranker_rank)), 1, "auto", config=shape).ranker)
  raise ValueError(f"policy={policy!r}: one of microspec, evospec, dynaspec, slimspec (a "
                   f"coverage-latency subset is subset_k=K)")


def _eagle_spec(name, kind, p, bench):
  subset_k = _bench_subset_k(kind, p, bench, "eagle:lm_head=target|subset_k=32768")
  policy = bench.get("policy", "")
  if p.vocab:
    raise ValueError("a head's vocab file settings are read for their sizes: give the policy "
                     "as bench settings, e.g. eagle:lm_head=target|policy=microspec;core=512;"
                     "window=2560")
  tree = TreeParams(p.top_k, p.depth, p.total_tokens)

  def build(a, s, mesh):
    vocab = _ranker_vocab(s, p.k, "auto") if p.ranker else None
    if subset_k or policy:  # a policy over a full-vocabulary LM head
      if p.lm_head != "target" and s.head_kind != "eagle2":
        raise ValueError("subset_k and policy restrict a full LM head: an EAGLE-1/2 head's, or "
                         "lm_head=target")
      vocab = (_subset_stand_in(subset_k, s.target.vocab_size) if subset_k
               else _head_policy_stand_in(policy, bench, s))
    kw = dict(tree=tree, lm_head=p.lm_head, draft_vocab=vocab, min_confidence=p.min_confidence)
    head = (a["target"], s.target, a["head"], abstract_head_config(s))
    proposer = EagleProposer(*head, **kw)
    if kind == "eagle_pld":
      proposer = HostTreeHybrid(proposer, LookupTrie(gamma=p.gamma, candidates=p.candidates))
    elif kind == "eagle_suffix":
      if mesh is not None:
        raise ValueError("eagle_suffix runs on one device")
      proposer = HostTreeHybrid(proposer, p.host_tree())
    return SpeculativeEngine(a["target"], s.target, proposer, mesh=mesh)

  what = f"chain of {p.depth}" if p.top_k == 1 else f"tree of {tree.total_tokens}"
  sizes = ";".join(f"{k}={v}" for k, v in sorted(bench.items()) if k not in ("policy", "impl"))
  about = (f", a static subset of {subset_k} rows" if subset_k else
           f", SpecVocab top-{p.k} (a rank-R ranker)" if p.ranker else
           f", {policy} ({sizes or 'its defaults'})" if policy else "")
  shaping = _shaping(kind, p) if not subset_k else {**_shaping(kind, p), "subset_k": subset_k}
  if policy:
    shaping = {**shaping, "policy": f"{policy};{sizes}"}
  return MethodSpec(name, kind, shaping, ("target", "head"), build,
                    f"EAGLE head (lm_head={p.lm_head}{about}), {what}"
                    + {"eagle_pld": " + prompt lookup",
                       "eagle_suffix": " + SuffixDecoding"}.get(kind, ""))


def _dflash_spec(name, kind, p, bench):
  """DFlash: a one-layer block drafter of the target's width (bench setting `block`, default
  16 as z-lab's), over the target's LM head, a static subset of it (`subset_k`) or a ranker's
  candidates (`ranker`, `k`); `version=2`: DFlash 2 (its convolutions and candidate selector,
  `speculators`' default sizes); `tree=KxD`: a tree over the positions' top-K down to depth D
  instead of the chain."""
  subset_k = _bench_subset_k(kind, p, bench, "dflash|subset_k=32768")
  block = int(bench.get("block", 16))
  version = int(bench.get("version", 1))
  if version not in (1, 2):
    raise ValueError(f"{name}: version={version}; DFlash is version 1 or 2")
  model = f"dflash{block}" + ("v2" if version == 2 else "")
  tree = None
  if bench.get("tree"):  # "KxD": every path of ranks < K down to depth D (Medusa's dense tree)
    k, _, d = bench["tree"].partition("x")
    tree = medusa_choices_for(int(d), int(k))

  def build(a, s, mesh):
    vocab = None
    if p.ranker:
      vocab = _ranker_vocab(s, p.k, "auto", config=s.target)
    elif subset_k:
      vocab = _subset_stand_in(subset_k, s.target.vocab_size)
    return SpeculativeEngine(a["target"], s.target, DFlashProposer(
        a["target"], s.target, a[model], abstract_dflash_config(s, block, version),
        draft_vocab=vocab, selector=p.selector and tree is None, tree=tree), mesh=mesh)

  policy = (f", a static subset of {subset_k} rows" if subset_k else
            f", SpecVocab top-{p.k} (a rank-R ranker)" if p.ranker else "")
  shaping = {**_shaping(kind, p), "block": block, **({"subset_k": subset_k} if subset_k else {}),
             **({"version": 2} if version == 2 else {})}
  what = "DFlash 2 drafter (its selector, " if version == 2 else "DFlash drafter ("
  if tree:
    shaping["tree"] = bench["tree"]
  return MethodSpec(name, kind, shaping, ("target", model), build,
                    f"{what}block of {block}, the target's LM head{policy}), "
                    + (f"tree of {len(tree)} over the positions' top-{bench['tree'].split('x')[0]}"
                       if tree else f"chain of {block - 1}"))


def _peagle_spec(name, kind, p, bench):
  """P-EAGLE: the setup's EAGLE-3 head with a mask token, `gamma` drafts per pass, over its own
  rows or the target's head (a static subset `subset_k` of it, or a ranker's candidates)."""
  subset_k = _bench_subset_k(kind, p, bench, "peagle:lm_head=target|subset_k=32768")

  def build(a, s, mesh):
    vocab = _ranker_vocab(s, p.k, "auto") if p.ranker else None
    if subset_k:
      if p.lm_head != "target":
        raise ValueError("subset_k restricts a full LM head: lm_head=target")
      vocab = _subset_stand_in(subset_k, s.target.vocab_size)
    return SpeculativeEngine(a["target"], s.target, PEagleProposer(
        a["target"], s.target, a["peagle_head"], abstract_peagle_config(s), drafts=p.gamma,
        lm_head=p.lm_head, draft_vocab=vocab), mesh=mesh)

  policy = (f", a static subset of {subset_k} rows" if subset_k else
            f", SpecVocab top-{p.k} (a rank-R ranker)" if p.ranker else "")
  shaping = {**_shaping(kind, p), **({"subset_k": subset_k} if subset_k else {})}
  return MethodSpec(name, kind, shaping, ("target", "peagle_head"), build,
                    f"P-EAGLE head (lm_head={p.lm_head}{policy}), chain of {p.gamma} from one "
                    f"pass")


def abstract_peagle_config(s: Setup) -> EagleConfig:
  """The setup's EAGLE-3 head (`abstract_head_config`) with a mask token: a P-EAGLE head."""
  return dataclasses.replace(abstract_head_config(s), mask_token_id=0)


def abstract_dflash_config(s: Setup, block: int, version: int = 1) -> DFlashConfig:
  """A DFlash drafter of `s.head_layers` layers for the setup's target (the target's width and
  heads, reading `s.head_layer_ids`, default its first, middle and last layers); version 2:
  DFlash 2 with `speculators`' default convolution and selector sizes (2 taps over groups of
  16 channels, rank 256, top 16)."""
  L = s.target.num_layers
  layer = s.target.replace(arch="qwen3", qk_norm=True, attention_bias=False,
                           num_layers=s.head_layers, layer_types=None, sliding_window=None,
                           intermediate_size=s.head_intermediate)
  ids = s.head_layer_ids or tuple(sorted({0, L // 2, L - 1}))
  return DFlashConfig(layer=layer, target_hidden_size=s.target.hidden_size,
                      target_layer_ids=tuple(ids), block_size=block,
                      mask_token_id=0,
                      **({"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                          "selector_top_k": 16} if version == 2 else {}))


def _medusa_spec(name, kind, p, bench):
  import json

  choices = json.loads(p.choices) if p.choices else None
  H = max(map(len, choices)) if choices else (p.depth or 3)
  if H < 1 or p.top_k < 1:
    raise ValueError(f"Medusa needs heads >= 1 and top-k >= 1, got {H} and {p.top_k}")
  choices = choices or medusa_choices_for(H, p.top_k)  # every path of ranks < k down to H
  return MethodSpec(
      name, kind, None, ("target", f"medusa{H}"), lambda a, s, mesh: SpeculativeEngine(
          a["target"], s.target,
          MedusaProposer(a["target"], s.target, a[f"medusa{H}"], _medusa_config(s, H), choices=
                         choices), mesh=mesh), f"Medusa-1, {H} heads with own [V, D] projections, "
      f"{len(choices)}-node tree")


def _lookup_spec(name, kind, p, bench):
  """Prompt lookup, the n-gram table and SuffixDecoding: host drafts, the target's step."""
  if kind == "pld":
    def build(a, s, mesh):
      return SpeculativeEngine(
          a["target"], s.target,
          LookupProposer(gamma=p.gamma, max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                         candidates=p.candidates), mesh=mesh)
    about = f"prompt lookup, the step verifying {p.candidates * p.gamma} looked-up drafts"
  elif kind == "ngram":
    def build(a, s, mesh):
      table = NgramTable.fit([[0, 1]])  # stand-in: the table never reaches the program
      return SpeculativeEngine(a["target"], s.target, NgramProposer(table, gamma=p.gamma),
                               mesh=mesh)
    about = f"n-gram table drafts, the step verifying {p.gamma}"
  else:
    def build(a, s, mesh):
      return SpeculativeEngine(a["target"], s.target, p.proposer(), mesh=mesh)
    about = (f"SuffixDecoding, the step verifying {p.max_spec_tokens} drafts"
             + (" as a tree" if p.use_tree else ""))
  return MethodSpec(name, kind, _shaping(kind, p), ("target",), build, about)


def _crossvocab_spec(name, kind, p, bench):
  if p.adaptive:
    raise ValueError("adaptive=true reads a trained acceptance head: not a bench stand-in")

  def build(a, s, mesh):
    ttok, dtok = _tokenizers()
    return SpeculativeEngine(
        a["target"], s.target,
        CrossVocabProposer(a["cross_draft"], s.crossvocab_draft, s.target, target_tokenizer=ttok,
                           draft_tokenizer=dtok, gamma=p.gamma, ngram=p.ngram), mesh=mesh)

  return MethodSpec(name, kind, _shaping(kind, p), ("target", "cross_draft"), build,
                    f"cross-vocabulary drafter, {p.gamma} drafts: its draft and verify programs "
                    f"(the host's translation between them not counted)",
                    while_trips=p.gamma - 1, loop_programs=("draft",))


def _covtrim_spec(name, kind, p, bench):
  raise ValueError("coverage-latency trimming's step is VocabTrim's (a static subset of K rows: "
                   "K = the saved subset's size): name it vocabtrim:k=K")


def _ar_spec(name, kind, p, bench):
  return MethodSpec(name, "ar", {}, ("target",),
                    lambda a, s, mesh: Decoder(a["target"], s.target, mesh=mesh),
                    "plain decoding's step")


_SPECS = {
    "ar": _ar_spec,
    "chain": _model_spec,
    "tree": _model_spec,
    "tree_suffix": _model_spec,
    "vocabtrim": _model_spec,
    "frspec": _model_spec,
    "specvocab": _model_spec,
    "microspec": _model_spec,
    "slimspec": _model_spec,
    "dynaspec": _model_spec,
    "evospec": _model_spec,
    "covtrim": _covtrim_spec,
    "eagle": _eagle_spec,
    "eagle_pld": _eagle_spec,
    "eagle_suffix": _eagle_spec,
    "medusa": _medusa_spec,
    "dflash": _dflash_spec,
    "peagle": _peagle_spec,
    "pld": _lookup_spec,
    "ngram": _lookup_spec,
    "suffix": _lookup_spec,
    "crossvocab": _crossvocab_spec
}


def abstract_head_config(s: Setup) -> EagleConfig:
  from vocabjax.train.eagle_step import head_config  # local: bench uses train's head shapes

  L = s.target.num_layers
  if s.head_kind == "dflash":
    raise ValueError("this setup's head is a DFlash drafter (a paper's pair): its methods are "
                     "dflash ones, no EAGLE head")
  if s.head_kind == "eagle2":  # EAGLE-1/2: the final normed feature, the target's V
    hc = head_config(s.target, (FINAL_NORMED,), s.target.vocab_size, s.head_intermediate)
    return dataclasses.replace(hc, kind="eagle2")
  layers = training_feature_layers(L)  # a short target's: distinct, in order
  return head_config(s.target, layers, min(s.head_vocab, s.target.vocab_size),
                     s.head_intermediate)


def _medusa_config(s: Setup, heads: int) -> MedusaConfig:
  return MedusaConfig(num_heads=heads, hidden_size=s.target.hidden_size,
                      vocab_size=s.target.vocab_size)


class _ShapeRanker(Ranker):
  """A ranker for abstract drafter weights: the drafter's fingerprint hashes its LM head's
  values, which abstract weights do not have, so only its shapes are checked."""

  def check_drafter(self, params, config) -> None:
    for key, got in (("hidden_size", config.hidden_size), ("vocab_size", config.vocab_size),
                     ("num_layers", config.num_layers)):
      if self.drafter.get(key) != got:
        raise ValueError(f"ranker made for {key}={self.drafter.get(key)}, drafter has {got}")


def _ranker_vocab(s: Setup, k: int, impl: str, config: LlamaLikeConfig | None = None
                  ) -> SpeculativeVocab:
  """A stand-in ranker over `config`'s LM head (default: the drafter's)."""
  dc, R = config or s.draft, s.ranker_rank
  # zeros: only the shapes [R, D] and [V, R] reach the program (as its arguments)
  ranker = _ShapeRanker(down=np.zeros((R, dc.hidden_size), np.float32),
                        vocab=np.zeros((dc.vocab_size, R), np.float32),
                        drafter={"hidden_size": dc.hidden_size, "vocab_size": dc.vocab_size,
                                 "num_layers": dc.num_layers, "fingerprint": "abstract"},
                        meta={"init": "zeros (deviceless TPU compile)"})
  return SpeculativeVocab(ranker, k, impl=impl)


@functools.cache
def _tokenizers():
  """Two tiny byte-level BPE tokenizers trained on different text (`vocabjax.testing.tiny`):
  the cross-vocabulary decoder needs a real pair to build its id map; the map is a [Vd] int32
  argument of the program, whatever it holds."""
  from vocabjax.testing.tiny import tiny_tokenizer  # local: transformers only for crossvocab

  corpus = ["The lazy dog sleeps while the quick fox runs.",
            "def mul(a, b):\n    return a * b\n", "print('hello world')"] * 20
  return tiny_tokenizer(400), tiny_tokenizer(320, corpus=corpus)


def abstract_models(setup: Setup, needs) -> dict:
  """ShapeDtypeStructs of the models `needs` names (`init_params` & co. under eval_shape)."""
  dtype = jnp.dtype(setup.dtype)
  key = jax.random.key(0)
  out = {}
  for name in needs:
    if name in ("target", "draft", "cross_draft"):
      cfg = {"target": setup.target, "draft": setup.draft,
             "cross_draft": setup.crossvocab_draft}[name]
      quant = {"int8": quantize_int8, "int4": quantize_grouped}.get(setup.weights, lambda p: p)
      out[name] = jax.eval_shape(lambda c=cfg: quant(init_params(key, c, dtype=dtype)))
    elif name == "head":
      out[name] = jax.eval_shape(lambda: init_eagle(key, abstract_head_config(setup), dtype=dtype))
    elif name == "peagle_head":
      out[name] = jax.eval_shape(lambda: init_eagle(key, abstract_peagle_config(setup),
                                                    dtype=dtype))
    elif name.startswith("dflash"):  # "dflash<bs>": a block of bs; "dflash<bs>v2": DFlash 2
      block, v2, _ = name[len("dflash"):].partition("v2")
      dc = abstract_dflash_config(setup, int(block), 2 if v2 else 1)
      out[name] = jax.eval_shape(lambda dc=dc: init_dflash(key, dc, dtype=dtype))
    elif name.startswith("medusa"):  # "medusa<H>": H heads
      mc, c = _medusa_config(setup, int(name[len("medusa"):])), setup.target
      out[name] = jax.eval_shape(lambda: init_medusa(
          key, mc, lm_head=jnp.zeros((c.vocab_size, c.hidden_size), dtype), dtype=dtype))
    else:
      raise ValueError(f"unknown model {name!r}")
  return out
