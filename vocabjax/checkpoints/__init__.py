"""All checkpoint I/O: HF safetensors directories, GGUF files, the offline model registry."""

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.checkpoints.loader import Model, default_dtype, load_model, parse_dtype
from vocabjax.checkpoints.zoo import REGISTRY, ChecksumError, fetch

__all__ = ["REGISTRY", "CheckpointError", "ChecksumError", "Model", "UnsupportedConfigError",
           "config_from_hf", "default_dtype", "fetch", "load_model", "parse_dtype"]
