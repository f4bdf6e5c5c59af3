"""``queue_inbound --imap``/``--pop3`` in a process that dies at a chosen point, as a crash would.

Run as ``python -m tests.feedback.mailbox_crash WHERE --imap URL`` in the test's
environment (``tests.helpers.worker_env``). ``WHERE`` is where the process ends at once
(``os._exit``: no ``finally``, no ``QUIT``, no ``LOGOUT``):

- ``before-remove``: a message has been processed, and its removal is about to be asked;
- ``before-quit``: POP3, every message processed and deleted with ``DELE``, before ``QUIT``;
- ``while-processing``: the ``bounced`` signal's receivers (the delivery log's among them,
  connected first) have run for the first hard bounce, and processing has not finished.
"""

from __future__ import annotations

import os
import sys

CRASHED = 70  # the exit status of a process that died where it was told


def main(where: str, *args: str) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.core.management import call_command

    from bumail_queue import signals
    from bumail_queue.feedback import mailbox

    def crash(*_: object, **__: object) -> None:
        sys.stdout.flush()
        os._exit(CRASHED)

    if where == "before-remove":
        mailbox.ImapSession.remove = crash  # type: ignore[method-assign]
        mailbox.Pop3Session.remove = crash  # type: ignore[method-assign]
    elif where == "before-quit":
        mailbox.Pop3Session.finish = crash  # type: ignore[method-assign]
    elif where == "while-processing":
        signals.bounced.connect(crash, weak=False)
    else:
        raise SystemExit(f"unknown point {where!r}")
    call_command("queue_inbound", *args)


if __name__ == "__main__":
    main(*sys.argv[1:])
