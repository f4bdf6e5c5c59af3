"""The Lua scripts of the Redis store, one per operation that writes (``lua/*.lua``).

Redis runs a script whole, with no command of another client between its steps, so
each script is the store's unit of atomicity. A script is sent by its SHA-1
(``EVALSHA``); when Redis no longer has it (a restart, a failover, ``SCRIPT
FLUSH``), by its text (``EVAL``), which also caches it again. ``EVAL`` rather than
``SCRIPT LOAD``: a worker's ACL user then needs no ``SCRIPT`` command.

Each script starts with a ``#!lua`` line (Redis 7's script flags). While Redis is
out of memory under ``maxmemory`` (``noeviction``), it refuses the add script whole,
before its first step, so an add is never half written. The scripts that claim,
renew, record, move, retry and drop say ``allow-oom``: they add next to nothing, and
a full Redis must still let workers deliver its mail, which is what frees its memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis import Redis
from redis.exceptions import NoScriptError

_LUA = resources.files("bumail_queue.stores.redis").joinpath("lua")

#: The layout of the keys that these scripts read and write; ``<prefix>schema`` holds it.
#: Layout 2 keeps the items no lease holds by lane (``lua/lanes.lua``); the schema
#: script brings a queue of layout 1 to it.
LAYOUT_VERSION = 2


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Script:
    """A Lua script, and the SHA-1 that ``EVALSHA`` names it by."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str, *, lanes: bool = False) -> Script:
        """Read ``lua/<name>.lua`` from the package; with ``lanes``, with the lanes'
        functions (``lua/lanes.lua``) put after its ``#!lua`` line."""
        source = _LUA.joinpath(f"{name}.lua").read_text("utf-8")
        if lanes:
            shebang, _, body = source.partition("\n")
            source = f"{shebang}\n{_LUA.joinpath('lanes.lua').read_text('utf-8')}{body}"
        sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        return cls(name=name, source=source, sha=sha)

    def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[str | bytes | int]) -> Any:
        """Run the script: by its SHA-1, or by its text when Redis lost it."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)


SCHEMA = Script.load("schema")
ADD = Script.load("add", lanes=True)
CLAIM = Script.load("claim", lanes=True)
CLAIM_ITEMS = Script.load("claim_items", lanes=True)
RENEW = Script.load("renew")
COMPLETE = Script.load("complete", lanes=True)
RESCHEDULE = Script.load("reschedule", lanes=True)
RETRY = Script.load("retry", lanes=True)
CANCEL = Script.load("cancel", lanes=True)
BULK_PAGE = Script.load("bulk_page")
HOLD = Script.load("hold", lanes=True)
RELEASE = Script.load("release", lanes=True)
LIST = Script.load("list")
LANES_HELD = Script.load("lanes_held", lanes=True)
SUPPRESS = Script.load("suppress")
SUPPRESSION_PAGE = Script.load("suppression_page")
SUPPRESSION_PURGE = Script.load("suppression_purge")
SHAPING_TAKE = Script.load("shaping_take")
SHAPING_RELEASE = Script.load("shaping_release")
SHAPING_RENEW = Script.load("shaping_renew")
SHAPING_FORGET = Script.load("shaping_forget")
STS_PURGE = Script.load("sts_purge")
