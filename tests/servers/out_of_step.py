"""A scripted MX that replies out of step once, as a hostile or broken server does.

``OutOfStepMX(strategy)`` is a script for :class:`~tests.servers.hostile_smtp.HostileSMTPServer`.
It answers every command in its place, each reply naming what it answers (``250 2.1.5
<r4@pipe.test> ok``), but for the first message to ``victim``, where it follows
``strategy`` once; every later connection and message is answered honestly:

``honest``
    nothing out of step: the control.
``early``
    ``354`` and, in the same write, ``250 early-accept <victim>`` before any data;
    ``550 5.1.1`` for the victim after the final dot, if the data comes.
``extra_550``
    ``250 accepted <victim>`` then ``550 5.1.1 ... <victim>`` after the final dot.
``extra_250``
    ``250 accepted <victim>`` then ``250 accepted again <victim>``.
``550_then_250``
    ``550 5.1.1 ... <victim>`` then ``250 accepted <victim>``.

Each extra reply goes in the same write as the reply it follows, so that it is there
to be read when the next command would be due, on every run.

``mail_grouped`` says, for each MAIL read, whether the client sent more with it (a
pipelined group) or waited for its reply. ``received`` lists the recipients of each message whose data reached its final dot;
``meant`` is the outcome the server's first reply after that dot gave each recipient
(what a client reading in step takes): ``"delivered"`` or ``"failed"``.
"""

from __future__ import annotations

import re
import threading

from .hostile_smtp import Peer

STRATEGIES = ("honest", "early", "extra_550", "extra_250", "550_then_250")

_ADDRESS = re.compile(r"<([^>]*)>")


class OutOfStepMX:
    """The script of a pipelining MX that misbehaves once, for ``victim``'s first message."""

    def __init__(self, strategy: str, victim: str = "r3@pipe.test", *, ehlo: bool = True) -> None:
        assert strategy in STRATEGIES, strategy
        self.strategy = strategy
        self.victim = victim
        self.ehlo = ehlo  # False: EHLO is refused, and the client falls back to HELO
        self.received: list[tuple[str, ...]] = []
        self.meant: dict[str, str] = {}
        self.mail_grouped: list[bool] = []
        self.played = False
        self._lock = threading.Lock()

    def _plays(self, recipients: list[str]) -> bool:
        with self._lock:
            if self.strategy == "honest" or self.played or self.victim not in recipients:
                return False
            self.played = True
            return True

    def __call__(self, peer: Peer) -> None:
        peer.send(b"220 pipe.test ESMTP\r\n")
        recipients: list[str] = []
        while True:
            line = peer.read_line()
            verb = line.split(" ", 1)[0].upper()
            if verb == "EHLO":
                if self.ehlo:
                    peer.send(b"250-pipe.test\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
                else:
                    peer.send(b"502 5.5.2 EHLO not understood\r\n")
            elif verb == "MAIL":
                self.mail_grouped.append(peer.buffered())
                recipients = []
                peer.send(b"250 2.1.0 sender ok\r\n")
            elif verb == "RCPT":
                address = _ADDRESS.search(line)
                recipients.append(address.group(1) if address else line)
                peer.send(f"250 2.1.5 <{recipients[-1]}> ok\r\n".encode())
            elif verb == "DATA":
                self._data(peer, recipients)
            elif verb == "QUIT":
                peer.send(b"221 2.0.0 Bye\r\n")
                return
            else:  # HELO, RSET, NOOP
                peer.send(b"250 2.0.0 OK\r\n")

    def _data(self, peer: Peer, recipients: list[str]) -> None:
        plays = self._plays(recipients)
        name = ", ".join(f"<{r}>" for r in recipients)
        if plays and self.strategy == "early":
            peer.send(f"354 go ahead\r\n250 2.0.0 early-accept {name}\r\n".encode())
        else:
            peer.send(b"354 go ahead\r\n")
        while peer.read_line() != ".":
            pass
        with self._lock:
            self.received.append(tuple(recipients))
        accepted = f"250 2.0.0 accepted {name}\r\n".encode()
        refused = f"550 5.1.1 {name} no such user here\r\n".encode()
        if not plays or self.strategy == "extra_250":
            first, extra = accepted, (accepted.replace(b"accepted", b"accepted again") if plays else b"")
        elif self.strategy == "extra_550":
            first, extra = accepted, refused
        elif self.strategy == "550_then_250":
            first, extra = refused, accepted
        else:  # early: the data came after all
            first, extra = refused, b""
        with self._lock:
            self.meant.update((r, "delivered" if first is accepted else "failed") for r in recipients)
        peer.send(first + extra)
        recipients.clear()
