"""Model and artifact I/O: HF safetensors directories, GGUF files, the offline model registry
(`zoo`), EAGLE-3 head directories (`eagle3`), distilled drafters (`distilled`) and the
tokenizer loader. Counts, subsets and rankers keep their formats beside their code
(`calibrate.counts`, `vocab.subset`, `vocab.ranked`); atomic writes live in `vocabjax.io`."""

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.checkpoints.loader import Model, default_dtype, load_model, parse_dtype
from vocabjax.checkpoints.zoo import REGISTRY, ChecksumError, fetch

__all__ = ["REGISTRY", "CheckpointError", "ChecksumError", "Model", "UnsupportedConfigError",
           "config_from_hf", "default_dtype", "fetch", "load_model", "parse_dtype"]
