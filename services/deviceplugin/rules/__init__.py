"""The device plugin's pure rules: the devices it advertises, Allocate's and Prepare's plans,
preferred allocations. No I/O (an import-linter contract keeps it so).
"""
