"""Host time of one batch-1 `generate` call of the tiny cross-vocabulary merging pair (what the
2,400-call chi-square test `test_exact_rule_with_merges_is_lossless[T1-batch1]` makes), and
where it goes (cProfile, top entries by cumulative time).

    python kernels/host_overhead.py [--calls 200] [--profile]

Results: kernels/results/profile/host_overhead.txt (with the commit it ran on).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--calls", type=int, default=200)
  ap.add_argument("--profile", action="store_true", help="under cProfile, with its top entries")
  args = ap.parse_args(argv)

  from vocabjax.decoding.crossvocab import CrossVocabProposer
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.sampling import SamplingParams
  from vocabjax.testing.fixtures import merging_pair

  ttok, dtok, tc, dc, target, draft, pool = merging_pair(seed=0)
  dec = SpeculativeEngine(
      target, tc,
      CrossVocabProposer(draft, dc, tc, target_tokenizer=ttok, draft_tokenizer=dtok, gamma=4,
                         rule="exact"))
  dec.proposer.learn(pool)
  prompt, sp = pool[:2], SamplingParams(temperature=1.0)
  for call in range(30):  # every block size compiled
    dec.generate([prompt], max_new_tokens=3, sampling=sp, seed=call)
  prof = cProfile.Profile() if args.profile else None
  t0 = time.perf_counter()
  if prof:
    prof.enable()
  for call in range(args.calls):
    dec.generate([prompt], max_new_tokens=3, sampling=sp, seed=1000 + call)
  if prof:
    prof.disable()
  ms = (time.perf_counter() - t0) / args.calls * 1e3
  print(f"{ms:.2f} ms per call ({args.calls} calls{', under cProfile' if prof else ''})")
  if prof:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(12)
    print(out.getvalue())


if __name__ == "__main__":
  main()
