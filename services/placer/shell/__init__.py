"""The placer's shell, one module per job (``docs/architecture.md``, "The placer's shell").

``context``: what the jobs share; ``held``: the pods this replica holds and their messages;
``watches``: KV watches into the view; ``intake``: pods in; ``waiting``: the waiting board and
rejections; ``releases``: releases and their timers; ``upkeep``: the profile, tenancy, stats
and periodic passes; ``explain``: ``tessera explain``. ``services/placer/service.py`` wires them
and runs the decide-and-commit loop.
"""
