"""Pallas kernels, each with a pure-jnp reference beside it: the indexed LM head
(`indexed_lm_head.py`, SpecVocab; GPU and TPU kernels, custom VJP, dispatcher)."""
