"""``tessera up``: the whole Tessera system on one machine (a development and test tool)."""
