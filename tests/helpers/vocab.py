"""Decoders with a trimmed and a full drafter vocabulary, built alike."""

from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams


def trimmed_and_full(kind, target, draft, config, sub, gamma=3, tp=TreeParams(2, 3, 5)):
  """(trimmed, full-vocabulary) decoders of one kind."""
  if kind == "chain":
    return (SpeculativeEngine(target, config,
                              ChainProposer(draft, config, config, gamma=gamma, draft_vocab=sub)),
            SpeculativeEngine(target, config, ChainProposer(draft, config, config, gamma=gamma)))
  return (SpeculativeEngine(target, config,
                            TreeProposer(draft, config, config, tree=tp, draft_vocab=sub)),
          SpeculativeEngine(target, config, TreeProposer(draft, config, config, tree=tp)))
