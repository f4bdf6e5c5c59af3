"""Wakes an idle worker of the Redis store: a subscription to the queue's wake channel."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from redis import Redis
from redis.client import PubSub
from redis.exceptions import RedisError

from bumail_queue.stores.base import WorkListener


class RedisListener(WorkListener):
    """A subscription to the queue's wake channel, on a connection of its own.

    Pub/Sub keeps nothing for a subscriber that is away: what is announced while the
    connection is down is found by the worker's poll (``POLL_SECONDS``).
    """

    def __init__(
        self,
        client: Redis,
        channel: str,
        translated: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self._translated = translated
        # redis types pubsub() from 8.2 on, not before: the ignore holds for both.
        self._pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        self._pubsub.subscribe(channel)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._translated("listen for new work"):
            while (remaining := deadline - time.monotonic()) > 0:
                if self._pubsub.get_message(timeout=remaining) is not None:
                    # Announcements that piled up meanwhile are one wake-up, not many.
                    while self._pubsub.get_message(timeout=0) is not None:
                        pass
                    return True
        return False

    def close(self) -> None:
        with contextlib.suppress(RedisError):  # the connection is gone already
            self._pubsub.close()
