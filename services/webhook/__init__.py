"""``tessera webhook``: the admission webhook (DESIGN section 13)."""
