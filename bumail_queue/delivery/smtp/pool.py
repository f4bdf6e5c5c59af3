"""The pool of open sessions kept for reuse, by host and by how they were opened."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable

from bumail_queue.delivery.envelope import Host

from .connection import _Connection, _Steps
from .tls import _Policy

#: A connection is not reused once it has been open this long, however busy: Postfix's
#: ``smtp_connection_reuse_time_limit``. New connections spread a busy destination's
#: mail over its hosts again, and follow a change of its DNS.
REUSE_TIME_LIMIT = 300.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Key:
    """What a pooled connection may be reused for."""

    name: str
    address: str | None
    port: int
    policy: _Policy


@dataclasses.dataclass(eq=False, slots=True)
class _Session:
    """An open connection to ``host``, and what it may be reused for."""

    conn: _Connection
    host: Host
    key: _Key
    opened: float = 0.0
    last_used: float = 0.0
    # Taken from the pool, or handed on with a follower's commands: until its first reply
    # is read, a failure means the server had gone, and nothing is decided.
    reused: bool = False
    # Between transactions (after EHLO, the reply to a final dot, or a 2xx to RSET): the
    # next MAIL needs no RSET before it (RFC 5321 §4.1.1.4: the dot ends the transaction).
    clean: bool = False
    # The item whose MAIL, RCPT and DATA went with the last final dot: the session is
    # that follower's, not the pool's, when the delivery that sent the dot ends.
    held_for: str | None = None
    # The host replied out of step lately: one command at a time, and no follower.
    lockstep: bool = False

    @property
    def pipelining(self) -> bool:
        """Whether commands go in groups (RFC 2920): the server offers it, and is trusted to."""
        return not self.lockstep and self.conn.has_extn("pipelining")


class _Pool:
    """Idle sessions, each kept ``reuse_seconds`` after its last use (0: none is kept).

    Thread-safe: a session taken from the pool is used by one thread until given back.
    """

    def __init__(self, *, reuse_seconds: float, steps: _Steps, clock: Callable[[], float]) -> None:
        self._reuse_seconds = max(0.0, reuse_seconds)
        self._steps = steps
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: dict[_Key, list[_Session]] = {}

    def take(self, key: _Key) -> _Session | None:
        """Return the most recently used pooled connection for ``key``, if still fresh."""
        stale: list[_Session] = []
        found: _Session | None = None
        now = self._clock()
        with self._lock:
            idle = self._idle.get(key, [])
            while idle and found is None:
                session = idle.pop()
                if now - session.last_used <= self._reuse_seconds and now - session.opened < REUSE_TIME_LIMIT:
                    found = session
                else:
                    stale.append(session)
            if not idle:
                self._idle.pop(key, None)
        self._quit_all(stale)
        return found

    def reusable(self, session: _Session) -> bool:
        """Return whether ``session`` may take another transaction after this one."""
        return self._reuse_seconds > 0 and self._clock() - session.opened < REUSE_TIME_LIMIT

    def give(self, session: _Session, *, keep: bool = True) -> None:
        """Keep ``session`` for reuse, or QUIT it when none is kept, ``keep`` is false, it is closed or it is old."""
        if not keep or session.conn.sock is None or not self.reusable(session):
            self._steps.quit(session.conn)
            return
        session.last_used = self._clock()
        with self._lock:
            self._idle.setdefault(session.key, []).append(session)

    def close_idle(self) -> None:
        """QUIT and close the pooled connections idle longer than ``reuse_seconds``."""
        now = self._clock()
        stale: list[_Session] = []
        with self._lock:
            for key in list(self._idle):
                idle = self._idle[key]
                stale.extend(s for s in idle if now - s.last_used > self._reuse_seconds)
                idle[:] = [s for s in idle if now - s.last_used <= self._reuse_seconds]
                if not idle:
                    del self._idle[key]
        self._quit_all(stale)

    def close(self) -> None:
        """QUIT and close every pooled connection."""
        with self._lock:
            sessions = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        self._quit_all(sessions)

    def count(self) -> int:
        """Return how many idle connections the pool holds."""
        with self._lock:
            return sum(len(idle) for idle in self._idle.values())

    def _quit_all(self, sessions: Iterable[_Session]) -> None:
        self._steps.quit_all(session.conn for session in sessions)
