"""The lab scripts (top-level kernels/, train/, eval/) as the tests load them (`load_script`), and
tiny configs for their dry runs."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).parents[2]
LAB = tuple(ROOT / d for d in ("kernels", "train", "eval"))


def script_path(name) -> Path:
  """The lab script `name` (a .py without its suffix, or a file name), in whichever of the lab
  folders holds it."""
  file = name if "." in name else f"{name}.py"
  found = [d / file for d in LAB if (d / file).is_file()]
  assert len(found) == 1, f"lab script {name}.py: found {found} in {[str(d) for d in LAB]}"
  return found[0]


def load_script(name):
  spec = importlib.util.spec_from_file_location(name, script_path(name))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def tiny_configs(tmp_path):
  base = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=256,
              hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
              max_position_embeddings=512, tie_word_embeddings=True, hidden_act="silu")
  base["num_hidden_layers"] = 6  # EAGLE-3's feature layers (1, L/2 - 1, L - 4) need L >= 5
  t, d = tmp_path / "t.json", tmp_path / "d.json"
  t.write_text(json.dumps(base))
  d.write_text(json.dumps(dict(base, hidden_size=16, num_hidden_layers=1)))
  return t, d

