"""vocabjax: speculative decoding of large-vocabulary language models in JAX."""

from vocabjax.checkpoints.loader import Model, default_dtype, load_model
from vocabjax.decoding.autoregressive import Decoder, GenerationResult, generate
from vocabjax.decoding.sampling import SamplingParams, log_probs, sample
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head, lm_head_weight
from vocabjax.sharding import make_mesh, shard_params

__all__ = [
    "Decoder", "GenerationResult", "KVCache", "LlamaLikeConfig", "Model", "SamplingParams",
    "default_dtype", "forward", "generate", "init_params", "lm_head", "lm_head_weight",
    "load_model", "log_probs", "make_mesh", "sample", "shard_params",
]
__version__ = "0.1.0"
