"""The placer's pure placement core: model, framework, plugins, ledger, profiles, tenancy, queue.

No I/O: only the standard library, msgspec and ``shared.messages``; time is an argument.
"""
