"""Reserved for a later issue (see the README's status)."""
