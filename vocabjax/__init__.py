"""vocabjax: speculative decoding of large-vocabulary language models in JAX."""

from vocabjax.backends import skip_absent_tpu

skip_absent_tpu()  # before anything starts JAX's backends (vocabjax/backends.py)

from vocabjax.checkpoints.loader import Model, default_dtype, load_model
from vocabjax.decoding import (ChainProposer, CrossVocabProposer, Decoder, EagleProposer,
                               GenerationResult, LookupProposer, MedusaProposer, Proposer,
                               SamplingParams, SpeculativeEngine, TreeParams, TreeProposer,
                               generate, log_probs, sample)
from vocabjax.methods import METHODS
from vocabjax.vocab import Ranker, SpeculativeVocab, VocabSubset
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head, lm_head_weight
from vocabjax.sharding import make_mesh, shard_params
from vocabjax.version import __version__

__all__ = [
    "ChainProposer", "CrossVocabProposer", "Decoder", "EagleProposer", "GenerationResult",
    "KVCache", "LlamaLikeConfig", "LookupProposer", "METHODS", "MedusaProposer", "Model",
    "Proposer", "Ranker", "SamplingParams", "SpeculativeEngine", "SpeculativeVocab",
    "TreeParams", "TreeProposer", "VocabSubset",
    "default_dtype", "forward", "generate", "init_params", "lm_head", "lm_head_weight",
    "load_model", "log_probs", "make_mesh", "sample", "shard_params", "__version__",
]
