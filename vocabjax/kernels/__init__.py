"""Kernels, each with a pure-jnp reference beside it. Now: the indexed LM head reference
(`indexed_lm_head.py`); the Pallas kernels come with issue 7."""
