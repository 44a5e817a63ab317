"""Engine benchmark on random weights of real shapes, for any backend (`python -m
vocabjax.bench`), and projected speedups from recorded acceptance (`python -m vocabjax.bench
project`).

  shapes   configs of the registry's models and of 7-8B targets, from config values alone
  engine   the programs timed: target forward + LM head over T tokens, drafter body, drafter
           heads (full, trimmed, SpecVocab), bytes read per program, read bandwidth
  run      the grid, resumable rows, bench.md / bench.json
  project  an eval run's steps x a benchmark's program times = projected tokens/s
"""
