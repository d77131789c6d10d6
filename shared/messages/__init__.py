"""Wire messages, one module per subject family.

Rules every message follows (see ``base.Message``): frozen, keyword-only msgspec Structs, JSON on
the wire so an operator can read any subject, additive evolution only (new fields carry defaults,
no field changes type, unknown fields are ignored on decode).
"""
