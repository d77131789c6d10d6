"""The dashboard's pure core: the state reducer (``state``) and the views rendered from it
(``views``). No I/O, no clock: time is passed in."""
