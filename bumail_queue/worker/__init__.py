"""The worker: claims due items, delivers them over SMTP, has every outcome recorded.

This package holds the scheduling together: the claim loop, which items start when
(``CONCURRENCY``, ``DOMAIN_CONCURRENCY``, slow sessions), the threads that deliver,
renew leases, listen for new mail and record, and a graceful stop. What one attempt
decided and how it is recorded and told (signals, delivery log, DSNs) is the
``Recorder``'s (``outcomes``); the delivery threads are a ``ThreadPool``
(``threads``); the SMTP and DNS work is the delivery layer's, behind the
``Transport`` and ``Resolver`` protocols.

One ``Worker`` runs one claim loop in the calling thread and delivers on a pool of
threads, one per session (SMTP is I/O, and ``smtplib`` blocks). The loop:

1. claims up to ``CLAIM_BATCH_SIZE`` due items once fewer than half a batch (or
   ``CONCURRENCY``) wait to start, so the claim overlaps the last deliveries, and
   looks their pending recipients up in the suppression list (one round trip): a
   suppressed recipient fails without a session;
2. starts each on a thread once fewer than ``CONCURRENCY`` sessions are making
   progress and its destinations have a free ``DOMAIN_CONCURRENCY`` slot (an item
   waiting for a busy domain never blocks the others). A session of a small message
   that has run ``SLOW_SESSION_SECONDS`` is waiting on its peer: it leaves
   ``CONCURRENCY`` for a budget of its own, so slow servers never starve the rest;
3. sleeps until a delivery ends, a session turns slow while items wait, the store
   announces new work, or ``POLL_SECONDS``.

A delivery thread whose message's final dot is about to go on a kept connection to a
server that offers PIPELINING takes a follower (``_take_follower``): the next waiting
item for the same destination starts on that session, in its slot, its commands sent
with the dot (RFC 2920), and the thread delivers it next: one round trip a message.
Not at a destination ``SHAPING`` limits, where every session asks for its own room.

A delivery thread hands its attempt to the recorder thread and takes the next item
while the outcome is written: the recorder thread lets a batch fill while sessions
are under way, and the ``Recorder`` writes it in one commit, then sends the signals
and DSNs. A side thread renews every held lease each third of ``LEASE_SECONDS``.
``stop()`` claims nothing more, lets deliveries under way end and records them, and
gives back what was claimed but not started: due at once, no attempt counted.

``Worker`` (``loop``) is made of one class per part, each over ``base`` (the state
the threads share, the delivery stack, stop and wake): ``followers`` (pipelining
across messages), ``attempts`` (one item's attempt), ``recording`` (the recorder
thread) and ``upkeep`` (leases, the listener, giving back); ``sessions`` holds what
the worker knows of a session and the limits it holds them to.
"""

from __future__ import annotations

from bumail_queue.delivery.envelope import Resolver, Transport
from bumail_queue.outcomes import Attempt, Meter, Stats, close_broken_connections

from .base import default_owner
from .loop import Worker

__all__ = [
    "Attempt",
    "Meter",
    "Resolver",
    "Stats",
    "Transport",
    "Worker",
    "close_broken_connections",
    "default_owner",
]
