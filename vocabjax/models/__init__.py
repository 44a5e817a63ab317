"""Pure-functional decoders: a frozen config, a params pytree and a `forward` function."""

from vocabjax.models.cache import KVCache
from vocabjax.models.config import ARCHITECTURES, LlamaLikeConfig
from vocabjax.models.llamalike import (forward, init_params, lm_head, lm_head_weight,
                                       param_shapes)

__all__ = ["ARCHITECTURES", "KVCache", "LlamaLikeConfig", "forward", "init_params", "lm_head",
           "lm_head_weight", "param_shapes"]
