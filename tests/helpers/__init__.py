"""Helpers the tests share: model configs, heads, fixtures' builders, command runners."""
