"""Placer service: decides node and GPUs for each pending pod with a pure placement core."""
