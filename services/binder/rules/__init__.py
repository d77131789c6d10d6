"""The binder's pure rules: bind plans, restores and their checks, node facts, what
``kubectl describe pod`` shows, ResourceSlices. No I/O (an import-linter contract keeps it so).
"""
