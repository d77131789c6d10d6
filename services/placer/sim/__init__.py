"""``tessera simulate``: replay a pod trace through the placement core (FGD methodology)."""
