"""Tessera's four services. They never import each other; they meet in ``shared`` over NATS."""
