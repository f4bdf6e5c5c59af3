"""The Redis store: the queue in Redis, through django-redis, for workers on many machines.

Every key starts with ``REDIS_KEY_PREFIX`` (see ``docs/redis.md`` for the layout):
an item is a hash, its message a string written and read byte for byte, and the
sorted sets ``items`` (all), ``ready`` (no lease holds them) and ``leases`` order
them. Every operation that writes is one Lua script (``scripts.py``), which Redis
runs whole: two workers never take the same item, and an add is all or nothing.
Reads are plain commands, one round trip each (a page of ``list`` is one read-only
script); a batch of outcomes is pipelined.

Times travel as whole microseconds since the epoch, the precision of ``datetime``,
so each comes back exactly as it was given; the scripts only compare them. A sorted
set's score is a double, exact for such numbers until the year 2255.

The class is made of one class per capability, each a thin call of its scripts
over ``connection`` (the client, its errors, its checks): ``items`` (adding, reading,
retrying, cancelling), ``claims`` (leases and outcomes), ``bulk`` (a filter's items in pages, held and
released in batches), ``gauges``, ``suppressions``,
``shaping`` and ``sts``; the key layout and value codec are ``layout``'s, the wake-up
``listener``'s.
"""

from __future__ import annotations

from bumail_queue.stores.base import WorkListener

from .bulk import RedisBulk
from .claims import RedisClaims
from .gauges import RedisGauges
from .items import RedisItems
from .listener import RedisListener
from .shaping import RedisShaping
from .sts import RedisSTS
from .suppressions import RedisSuppressions


class RedisStore(RedisItems, RedisClaims, RedisBulk, RedisGauges, RedisSuppressions, RedisShaping, RedisSTS):
    """Keeps the queue in the Redis of the django-redis alias ``REDIS_CONNECTION``.

    Nothing connects when the store is built: the first call does, and checks that
    the prefix holds this store's layout (``<prefix>schema``) and that Redis will not
    evict the queue's keys (``maxmemory-policy``).
    """

    supports_transactional_enqueue = False
    claims_by_id = True
    supports_shaping = True

    def listener(self) -> WorkListener | None:
        """A Pub/Sub subscription on its own connection: idle workers wake on enqueue."""
        client = self._redis()
        with self._translated_errors("listen for new work"):
            return RedisListener(client, self.keys.wake, self._translated_errors)
