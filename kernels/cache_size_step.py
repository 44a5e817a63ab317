import time, sys, jax, numpy as np
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.sampling import SamplingParams
m = load_model("qwen2.5-coder-1.5b-instruct", dtype=sys.argv[1], load_tokenizer=False, progress=False)
dec = Decoder(m.params, m.config)
prompt = [list(np.random.RandomState(0).randint(100, 5000, 100))]
g = SamplingParams(temperature=0.0)
Ss = [256, 1024, 4096]
for S in Ss:
  dec.generate(prompt, max_new_tokens=8, sampling=g, max_len=S)
res = {S: [] for S in Ss}
for r in range(4):
  for S in Ss:
    t = time.perf_counter(); dec.generate(prompt, max_new_tokens=56, sampling=g, max_len=S); a = time.perf_counter() - t
    t = time.perf_counter(); dec.generate(prompt, max_new_tokens=8, sampling=g, max_len=S); b = time.perf_counter() - t
    res[S].append((a - b) / 48 * 1000)
for S in Ss:
  print(f"S={S}: step ms min {min(res[S]):.1f} median {np.median(res[S]):.1f} ({', '.join(f'{x:.1f}' for x in res[S])})", flush=True)
