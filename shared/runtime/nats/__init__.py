"""The NATS adapter of the Bus port (``shared.runtime.bus``): the only code that imports ``nats``.

One class, :class:`NatsBus`, put together from one module per job:

* ``connection``: the connection's state, nats-py's callbacks, reconnect back-off, why a
  server could not be reached or refused us;
* ``store``: the store behind the connection: streams and buckets (topology), its epoch,
  revisions across a lost store, and how every write is run;
* ``kv``: KV reads, writes, compare-and-set and watches (sent each change as written, or asking
  for them in batches);
* ``messaging``: core publish/subscribe/request, JetStream publish and durable pull consumers;
* ``adapter``: :class:`NatsBus` itself, its first connection and its drain.

The errors a caller handles and :class:`ConnectionMonitor` are the port's (``shared.runtime.bus``).

Writes during a NATS outage (issue 9). nats-py buffers what is published while it reconnects and
sends it after the reconnect; a KV write is a JetStream publish awaiting an acknowledgement, so a
compare-and-set that timed out could land long after its caller gave up. The adapter never lets a
write sit in that buffer:

* a write (publish, JetStream publish, any KV write) while disconnected raises
  :class:`BusUnavailableError` at once: nothing was sent and nothing will land later;
* whatever was queued but not yet on the wire when the connection drops is discarded, and a
  request still waiting for its answer then raises :class:`OutcomeUnknownError` at once (as does
  one whose answer times out): it may or may not have reached the server, and it will not reach
  it later, so reading the key back after the reconnect tells what happened.

Durability (docs/design.md §12). Every stream and KV bucket is created with the replica count the
service was given (``--nats-replicas``: 3 on a 3-server JetStream cluster, so that losing a server
loses nothing). A stream or bucket that has gone (NATS restarted with an empty store, someone
deleted it) is created again, never a reason to fail: after every reconnect, and whenever an
operation finds it missing (a write then raises :class:`BusUnavailableError`: nothing was
written; a watch starts over on the new, empty bucket; a durable consumer is attached again).
The store also holds its *epoch* (``tessera-meta``, created with the topology): a new epoch tells
the services that the store was lost, and what it held is rebuilt from the Kubernetes API (the
binder republishes what is bound; placers turn ready only once it has). After each reconnect no
KV operation runs before the bus has checked the store it came back to; when the epoch is new,
the revisions of the new store are reported above every revision the bus reported before, and a
compare-and-set at a revision of the lost store loses (as if the entry had moved on): a mirror
that keeps the newest revision of each key takes the new store's values, and no write decided on
what the lost store held can land in the new one by compare-and-set.

Security (docs/design.md §11): :meth:`NatsBus.connect` takes a :class:`~shared.config.NatsSecurity`
(user/password, token, NKey seed, ``.creds`` file, TLS). A first connection the server refuses for
its credentials or TLS raises :class:`NatsRefusedError` (retrying cannot help); any other first
failure is an ordinary exception the caller retries. After the first success the adapter
reconnects forever; failed attempts back off (doubling up to 30 s when the server refuses the
credentials) and are logged once per back-off step. :class:`ConnectionMonitor` reports the state
(``/readyz``, ``/metrics``) and when the client closed for good.
"""

from shared.runtime.nats.adapter import NatsBus
from shared.runtime.nats.connection import (
    DEFAULT_INBOX_PREFIX,
    NatsRefusedError,
    NatsUnreachableError,
    unreachable_reason,
)

__all__ = [
    "DEFAULT_INBOX_PREFIX",
    "NatsBus",
    "NatsRefusedError",
    "NatsUnreachableError",
    "unreachable_reason",
]
