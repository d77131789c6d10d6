"""The placer's pure rules around the placement core: the view of the cluster, decisions,
the commit protocol's rules, charges, pools, statistics. Plain functions and classes over
msgspec Structs, time passed in, no I/O (an import-linter contract keeps it so).
"""
