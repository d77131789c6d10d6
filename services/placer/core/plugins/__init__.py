"""Placement plugins: one module per filter, score or GPU choice (see ``profiles.py`` for names)."""
