"""Hosts remembered for a while: those that did not answer (RFC 5321 §4.5.4.1), and
those that replied out of step.

RFC 5321 §4.5.4.1 asks a client to keep a list of the hosts it cannot reach, rather
than try every queued item on them again. The transport keeps one for all of the
worker's delivery threads: a host that refused the connection, could not be reached,
or stayed silent through its CONNECT or GREETING timeout is not connected to again
for ``UNREACHABLE_HOST_MEMORY``, and the items meant for it are deferred with the
reason it was remembered for.

A host that sent a reply before what it answers was sent, or one reply too many, is
remembered as well, for :data:`OUT_OF_STEP_MEMORY`: its sessions then send one
command at a time and take no follower, so that one bad server costs one retry.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable

from bumail_queue.delivery.envelope import Host
from bumail_queue.items import Reply

from .failures import _StepError
from .replies import _own

#: The most hosts remembered at once: past it the oldest is forgotten first.
MAX_UNREACHABLE_HOSTS = 10_000
#: How long a host that replied out of step gets one command at a time, in seconds.
OUT_OF_STEP_MEMORY = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Silence:
    """Why a host was remembered, and when."""

    reply: Reply
    since: float


def _key(host: Host) -> tuple[str, int]:
    # The address is what did not answer: MX names that share it share its entry.
    return (host.address or host.name.lower(), host.port)


class _HostMemory:
    """Hosts, each remembered ``seconds`` (0: none is) with why.

    Thread-safe: every delivery thread of the transport shares it. Bounded: an entry
    expires after ``seconds``, the expired ones are dropped as others are added, and
    past :data:`MAX_UNREACHABLE_HOSTS` entries the oldest is dropped.
    """

    def __init__(self, *, seconds: float, clock: Callable[[], float]) -> None:
        self._memory = max(0.0, seconds)
        self._clock = clock
        self._limit = MAX_UNREACHABLE_HOSTS
        self._lock = threading.Lock()
        # Oldest first: the clock never goes back, so entries expire in this order.
        self._hosts: dict[tuple[str, int], _Silence] = {}

    @property
    def seconds(self) -> float:
        """How long a host is remembered (0: the memory is off)."""
        return self._memory

    def remember(self, host: Host, failure: _StepError) -> bool:
        """Remember ``host``, for ``failure``'s reason; return whether it is remembered."""
        if self._memory <= 0:
            return False
        now = self._clock()
        key = _key(host)
        with self._lock:
            self._hosts.pop(key, None)  # added again as the newest
            self._drop_expired(now)
            while len(self._hosts) >= self._limit:
                del self._hosts[next(iter(self._hosts))]
            self._hosts[key] = _Silence(reply=failure.reply, since=now)
        return True

    def _recall(self, host: Host) -> tuple[_Silence, float] | None:
        """Return why ``host`` is remembered, and the time now; ``None`` if it is not."""
        if self._memory <= 0:
            return None
        now = self._clock()
        key = _key(host)
        with self._lock:
            silence = self._hosts.get(key)
            if silence is not None and now - silence.since >= self._memory:
                del self._hosts[key]
                silence = None
        return None if silence is None else (silence, now)

    def holds(self, host: Host) -> bool:
        """Return whether ``host`` is remembered now."""
        return self._recall(host) is not None

    def forget(self, host: Host) -> None:
        """Forget ``host``."""
        if self._memory <= 0:
            return
        with self._lock:
            self._hosts.pop(_key(host), None)

    def count(self) -> int:
        """Return how many hosts are remembered now."""
        now = self._clock()
        with self._lock:
            self._drop_expired(now)
            return len(self._hosts)

    def _drop_expired(self, now: float) -> None:
        while self._hosts:
            oldest = next(iter(self._hosts))
            if now - self._hosts[oldest].since < self._memory:
                return
            del self._hosts[oldest]


class _UnreachableHosts(_HostMemory):
    """Hosts that did not answer: the recipients meant for them are deferred, unsent."""

    def recall(self, host: Host) -> _StepError | None:
        """Return what defers the recipients while ``host`` is remembered; ``None`` to try it."""
        recalled = self._recall(host)
        if recalled is None:
            return None
        # Not unreachable itself: recalling a host must not remember it anew, for ever.
        return _StepError(self._deferral(host, *recalled))

    def _deferral(self, host: Host, silence: _Silence, now: float) -> Reply:
        # The remembered failure's enhanced code; no server answered, so no reply code.
        age = now - silence.since
        left = max(1, math.ceil(self._memory - age))
        text = (
            f"{host} did not answer {age:.0f} s ago ({silence.reply.text}); "
            f"not tried again before {left} s pass (UNREACHABLE_HOST_MEMORY)"
        )
        return _own(silence.reply.status, text)
