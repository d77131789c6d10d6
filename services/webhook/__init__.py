"""``tessera webhook``: the admission webhook (docs/design.md §13)."""
