"""The Redis store's footing: its client, the errors Redis raises, and its checks.

``RedisConnection`` is what each of the store's capabilities is built on: it gets the
django-redis client of ``REDIS_CONNECTION`` at the first call, refusing a Redis that
may evict the queue's keys or a prefix that holds another layout; it runs a script,
or one per argument list pipelined; it turns Redis's errors into ``QueueError`` and
says what to do about them; and it gives ``manage.py check`` its findings on the
``CACHES`` entry and on ``maxmemory-policy``.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.cache.backends.base import InvalidCacheBackendError
from django.utils.module_loading import import_string
from django_redis import get_redis_connection
from django_redis.cache import RedisCache
from redis import ConnectionPool, Redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterCrossSlotError,
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bumail_queue.conf import QueueSettings
from bumail_queue.errors import (
    ErrorCode,
    QueueConfigurationError,
    QueueError,
    first_line,
)
from bumail_queue.stores.base import QueueStore

from . import scripts
from .layout import RedisKeys

#: The ``maxmemory-policy`` values under which a full Redis may delete the queue's keys.
#: The ``volatile-*`` policies are not among them: they evict only keys with a time to
#: live, and the store never gives its keys one.
EVICTING_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})

# The system check connects while manage.py waits: it must not hang on a Redis that
# drops packets, whatever timeouts CACHES gives the store's own connections.
_CHECK_TIMEOUT_SECONDS = 3.0


class RedisConnection(QueueStore):
    """The client of the django-redis alias ``REDIS_CONNECTION`` under a store's prefix.

    The store's capabilities (``RedisStore``'s other bases) run every command through
    ``_redis``, ``_run`` and ``_run_many`` and within ``_translated_errors``.
    """

    def __init__(self, settings: QueueSettings) -> None:
        super().__init__(settings)
        self.alias: str = settings.redis_connection
        self.keys = RedisKeys(settings.redis_key_prefix)
        self._client: Redis | None = None
        self._schema_checked = False
        self._schema_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------

    def _redis(self) -> Redis:
        """Return the client, checking the eviction policy and the prefix's layout at the first call."""
        client = self._client
        if client is None:
            try:
                client = get_redis_connection(self.alias, write=True)
            except (InvalidCacheBackendError, NotImplementedError) as error:
                raise QueueConfigurationError(
                    f"BUMAIL_QUEUE['REDIS_CONNECTION'] is {self.alias!r}, which is not a django-redis cache of CACHES "
                    "with one Redis (or a primary and its replicas)."
                ) from error
            self._client = client
        if not self._schema_checked:
            with self._schema_lock, self._translated_errors("check the queue's layout"):
                if not self._schema_checked:
                    # The policy first: on a Redis that may evict, not even the layout is written.
                    self._refuse_eviction(read_eviction_policy(client))
                    found = scripts.SCHEMA(client, [self.keys.schema], [str(scripts.LAYOUT_VERSION), self.keys.prefix])
                    self._check_schema(found)
                    self._schema_checked = True
        return client

    def _refuse_eviction(self, policy: str | None) -> None:
        # Under an allkeys-* policy a full Redis deletes items and messages to make
        # room, and mail vanishes with no DSN, log entry or signal: refuse to work.
        # A policy that cannot be read (no CONFIG, no INFO) is left to the check.
        if policy is not None and policy in EVICTING_POLICIES:
            raise QueueConfigurationError(self._eviction_problem(policy))

    def _eviction_problem(self, policy: str) -> str:
        return (
            f"Redis of CACHES[{self.alias!r}] has maxmemory-policy {policy!r}: when full, it "
            "deletes queued mail to make room. Set maxmemory-policy noeviction on that Redis "
            "(or give the queue a Redis of its own)."
        )

    def _check_schema(self, found: bytes) -> None:
        text = found.decode("utf-8", "replace")
        if text == str(scripts.LAYOUT_VERSION):
            return
        if text.isdigit() and int(text) > scripts.LAYOUT_VERSION:
            problem = f"holds layout {text}, written by a newer version of bumail_queue than this one"
        else:
            problem = "holds something other than a layout version: the prefix is another application's"
        raise QueueConfigurationError(
            f"The Redis queue cannot be set up: {self.keys.schema!r} {problem}. "
            "Give BUMAIL_QUEUE['REDIS_KEY_PREFIX'] a prefix of the queue's own."
        )

    @contextmanager
    def _translated_errors(self, doing: str) -> Iterator[None]:
        """Raise Redis's errors as ``QueueError(STORE_UNAVAILABLE)``, saying what to do.

        Out of memory is ``STORE_FULL``: a refusal the caller can tell from an outage.
        """
        try:
            yield
        except AuthenticationError as error:
            raise self._unavailable(doing, "Redis refused the credentials of CACHES", error) from error
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise self._unavailable(doing, "Redis could not be reached through CACHES", error) from error
        except ResponseError as error:
            if _out_of_memory(error):
                raise QueueError(
                    ErrorCode.STORE_FULL,
                    f"Could not {doing}: Redis of CACHES[{self.alias!r}] is at its maxmemory and refused "
                    "the write; nothing was written. Deliver or cancel queued mail, or raise maxmemory.",
                ) from error
            raise self._unavailable(doing, _refusal(error), error) from error
        except RedisError as error:
            raise self._unavailable(doing, "Redis failed through CACHES", error) from error

    def _unavailable(self, doing: str, what: str, error: Exception) -> QueueError:
        where = f"{what}[{self.alias!r}]" if what.endswith("CACHES") else what
        return QueueError(
            ErrorCode.STORE_UNAVAILABLE,
            f"Could not {doing}: {where}: {first_line(error)}",
        )

    def _run(
        self,
        script: scripts.Script,
        doing: str,
        keys: Sequence[str],
        args: Sequence[str | bytes | int],
    ) -> Any:
        client = self._redis()
        with self._translated_errors(doing):
            return script(client, keys, args)

    def _run_many(
        self,
        script: scripts.Script,
        doing: str,
        keys: Sequence[str],
        arg_lists: Sequence[Sequence[str | bytes | int]],
    ) -> builtins.list[Any]:
        """Run a script once per argument list, pipelined: one round trip for all."""
        if not arg_lists:
            return []
        client = self._redis()
        with self._translated_errors(doing):
            pipe = client.pipeline(transaction=False)
            for args in arg_lists:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            for index, reply in enumerate(replies):
                if isinstance(reply, NoScriptError):  # Redis lost it: by its text, once
                    replies[index] = script(client, keys, arg_lists[index])
                elif isinstance(reply, Exception):
                    raise reply
        return list(replies)

    # -- checks -----------------------------------------------------------------------

    def check(self, **kwargs: Any) -> builtins.list[checks.CheckMessage]:
        """E018 from the settings alone; then, connecting, E022 or W003 on the eviction policy."""
        problem = _connection_problem(self.alias)
        if problem is None:
            return self._check_eviction_policy()
        return [
            checks.Error(
                f"BUMAIL_QUEUE['REDIS_CONNECTION'] is {self.alias!r}: {problem}",
                hint="Name a CACHES entry whose BACKEND is 'django_redis.cache.RedisCache', on one Redis "
                "(or a primary and its replicas), with bytes left undecoded.",
                obj="BUMAIL_QUEUE",
                id="bumail_queue.E018",
            )
        ]

    def _check_eviction_policy(self) -> builtins.list[checks.CheckMessage]:
        try:
            with _client_for_checks(self.alias) as client, self._translated_errors("read maxmemory-policy"):
                policy = read_eviction_policy(client)
        except QueueError as error:
            # Unreachable is no error of the set-up: a deploy may run checks where Redis
            # is out of reach. The worker reads the policy again when it starts.
            return [self._unchecked_policy(error.message)]
        if policy is None:
            return [
                self._unchecked_policy(
                    f"Could not read maxmemory-policy: Redis of CACHES[{self.alias!r}] refused both "
                    "CONFIG GET and INFO to this user."
                )
            ]
        if policy not in EVICTING_POLICIES:
            return []
        return [
            checks.Error(
                self._eviction_problem(policy),
                hint="redis-cli CONFIG SET maxmemory-policy noeviction, and the same line in redis.conf. "
                "A full Redis then refuses new mail (STORE_FULL) instead of losing queued mail.",
                obj="BUMAIL_QUEUE",
                id="bumail_queue.E022",
            )
        ]

    def _unchecked_policy(self, why: str) -> checks.CheckMessage:
        return checks.Warning(
            why,
            hint="The Redis store refuses a Redis that may evict its keys (E022); "
            "allow INFO to the queue's ACL user, and run the check where Redis can be reached.",
            obj="BUMAIL_QUEUE",
            id="bumail_queue.W003",
        )


# -- errors and checks ----------------------------------------------------------------


def _reply_text(error: ResponseError) -> str:
    return f"{getattr(error, 'status_code', None) or ''} {error}".strip()


def _out_of_memory(error: ResponseError) -> bool:
    """Whether Redis refused a command for want of memory (``-OOM``, under ``noeviction``)."""
    return isinstance(error, OutOfMemoryError) or _reply_text(error).startswith("OOM")


def _refusal(error: ResponseError) -> str:
    """Say what a Redis error reply means for the queue."""
    reply = _reply_text(error)
    if isinstance(error, ReadOnlyError) or reply.startswith("READONLY"):
        return "Redis is a replica, which refuses writes; point REDIS_CONNECTION at the primary"
    if isinstance(error, NoPermissionError) or reply.startswith("NOPERM"):
        return "Redis refused the command to this user; see the ACL the Redis store needs"
    if isinstance(error, AskError | TryAgainError | ClusterCrossSlotError | ClusterDownError):
        return "Redis Cluster is not supported: the queue's keys must live on one Redis"
    if "near '#'" in reply:
        return "the Redis store needs Redis 7.0 or newer (script flags)"
    return "Redis refused the command"


def read_eviction_policy(client: Redis) -> str | None:
    """Return Redis's ``maxmemory-policy``, or ``None`` when this user may read it nowhere.

    ``CONFIG GET`` first; managed services that rename or forbid ``CONFIG`` still
    answer ``INFO memory``. Errors other than a refusal (a lost connection) are raised.
    """
    try:
        found: Mapping[Any, Any] = client.config_get("maxmemory-policy")
        policy = found.get("maxmemory-policy", found.get(b"maxmemory-policy"))
    except ResponseError:  # NOPERM, or an unknown (renamed) command
        try:
            policy = client.info("memory").get("maxmemory_policy")
        except ResponseError:
            return None
    if isinstance(policy, bytes):
        policy = policy.decode("ascii", "replace")
    return None if policy is None else str(policy)


@contextmanager
def _client_for_checks(alias: str) -> Iterator[Redis]:
    """Yield a client of ``alias`` whose connections give up after a few seconds."""
    client = get_redis_connection(alias, write=True)
    pool = client.connection_pool
    if type(pool) is not ConnectionPool:  # Sentinel and the like: as configured
        yield client
        return
    kwargs = {**pool.connection_kwargs}
    kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = _CHECK_TIMEOUT_SECONDS
    quick = ConnectionPool(connection_class=pool.connection_class, **kwargs)
    try:
        yield Redis(connection_pool=quick)
    finally:
        quick.disconnect()


def _connection_problem(alias: str) -> str | None:
    """Say why the ``CACHES`` entry ``alias`` cannot serve the store, or ``None``."""
    caches = getattr(django_settings, "CACHES", {})
    if alias not in caches:
        return f"CACHES has no such alias (it has {', '.join(map(repr, caches)) or 'none'})."
    config = caches[alias]
    try:
        backend = import_string(config.get("BACKEND", ""))
    except ImportError:
        backend = None
    if not (isinstance(backend, type) and issubclass(backend, RedisCache)):
        return f"its BACKEND is {config.get('BACKEND')!r}, not django-redis's RedisCache."
    options = config.get("OPTIONS", {})
    client_class = options.get("CLIENT_CLASS", "")
    if client_class.rpartition(".")[2] == "ShardClient":
        return "it shards keys over several servers; the queue's keys must live on one Redis."
    if options.get("CONNECTION_POOL_KWARGS", {}).get("decode_responses"):
        return "its connections decode replies (decode_responses), so messages would not come back byte for byte."
    return None
