"""The ORM store's claim: the due items of every lane, channels in turn.

An item's lane is its channel and its priority. The index ``bumail_queue_items_lane``
on ``(channel, priority, next_attempt_at, seq)`` keeps each lane's items together,
earliest due first, so a lane's due items are the front of its range however many of
its items wait for later (retries, mail sent with ``at=``, leased items, whose
``next_attempt_at`` is their lease's end). A claim:

1. finds the lanes by skipping through that index: the next lane is the first entry
   above the last one found, one probe each, whatever the number of items;
2. reads the first ``limit`` due items at the front of each lane;
3. orders them as ``items.fair_order`` does (channels in turn, the higher priority
   first, then the earliest due, then the oldest) and leases the first ``limit``.

Its cost is one index probe per lane and ``limit`` index entries per lane with due
items: logarithmic in the queue's size, linear in its lanes (``docs/stores.md``).

On PostgreSQL the three steps are one statement (a recursive CTE, a ``LATERAL`` read
per lane, a window function), whose row locks skip what another claimer holds. On
SQLite they are a statement per lane under the database's write lock, in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bumail_queue.items import fair_order

Quote = Callable[[str], str]


def lanes_sql(q: Quote, items: str) -> str:
    """A recursive CTE ``lanes(channel, priority)``: every lane, one index probe each.

    From a lane, the next is the lane of the first index entry above it; that entry's
    ``seq`` is read from the index, and its row through the primary key.
    """
    lane = f"{q('channel')}, {q('priority')}"
    above = f"SELECT {q('seq')} FROM {items} WHERE ({lane}) > (lanes.channel, lanes.priority) ORDER BY {lane} LIMIT 1"
    return (
        f"lanes (channel, priority) AS ("
        f"SELECT * FROM (SELECT {lane} FROM {items} ORDER BY {lane} LIMIT 1) AS first_lane "
        f"UNION ALL SELECT next_lane.{q('channel')}, next_lane.{q('priority')} "
        f"FROM lanes JOIN {items} AS next_lane ON next_lane.{q('seq')} = ({above}))"
    )


def _due_in_lane_sql(q: Quote, items: str, channel: str, priority: str, lock: str = "") -> str:
    """The first ``%s`` (limit) items due at ``%s`` (now, twice) of one lane, with their due time."""
    return (
        f"SELECT {q('seq')}, {q('next_attempt_at')} FROM {items} "
        f"WHERE {q('channel')} = {channel} AND {q('priority')} = {priority} AND {q('next_attempt_at')} <= %s "
        f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s) "
        f"ORDER BY {q('next_attempt_at')}, {q('seq')} LIMIT %s{lock}"
    )


def postgres_claim_sql(q: Quote, table: str, turn_table: str, lease_set: str, select_list: str) -> str:
    """The claim as one PostgreSQL statement.

    Parameters, in order: now, now, limit (the lanes' fronts), limit (the lease),
    then ``lease_set``'s owner, expiry, expiry. Each returned row is the item's place
    in the claim's order, then ``select_list``'s columns.
    """
    items, turns = q(table), q(turn_table)
    # Each lane's front is locked as it is read, skipping rows another claimer holds,
    # as a queue of one lane always was: two claimers read past each other and never
    # come back empty while items are due. A row leased meanwhile fails the re-check
    # of its due time and lease, and the read goes on past it. With one lane, what is
    # locked is what is leased; with several, the fronts not leased are let go of
    # when the statement ends.
    due = _due_in_lane_sql(q, items, "lanes.channel", "lanes.priority", " FOR UPDATE SKIP LOCKED")
    # Channel names are compared byte by byte (ASCII), as every store compares them.
    channel = 'channel COLLATE "C"'
    return (
        f"WITH RECURSIVE {lanes_sql(q, items)}, "
        f"fronts AS (SELECT front.{q('seq')} AS seq, front.{q('next_attempt_at')} AS due_at, "
        f"lanes.channel, lanes.priority FROM lanes CROSS JOIN LATERAL ({due}) AS front), "
        f"turn_after AS (SELECT COALESCE((SELECT {q('last_channel')} FROM {turns} WHERE {q('id')} = 1), '') "
        f'COLLATE "C" AS after_channel), '
        f"ranked AS (SELECT seq, due_at, priority, channel, row_number() OVER "
        f"(PARTITION BY channel ORDER BY priority DESC, due_at, seq) AS turn FROM fronts), "
        f"chosen AS (SELECT ranked.*, ranked.{channel} <= turn_after.after_channel AS wrapped "
        f"FROM ranked, turn_after ORDER BY turn, priority DESC, wrapped, {channel} LIMIT %s), "
        f"last_served AS (SELECT channel FROM chosen "
        f"ORDER BY turn DESC, priority, wrapped DESC, {channel} DESC LIMIT 1), "
        # The round-robin moves on to the channel served last; a claimer that finds
        # another moving it meanwhile leaves it to that one rather than wait.
        f"turn_moved AS (UPDATE {turns} SET {q('last_channel')} = last_served.channel FROM last_served "
        f"WHERE {turns}.{q('id')} = (SELECT {q('id')} FROM {turns} WHERE {q('id')} = 1 FOR UPDATE SKIP LOCKED)), "
        f"turn_made AS (INSERT INTO {turns} ({q('id')}, {q('last_channel')}) SELECT 1, channel FROM last_served "
        f"WHERE NOT EXISTS (SELECT 1 FROM {turns}) ON CONFLICT ({q('id')}) DO NOTHING) "
        # The lease is committed without waiting for the disk (synchronous_commit off
        # for this statement's transaction alone): a lease a database crash forgets
        # only makes the item claimable again, as a worker's crash does, and the
        # worker's next synchronous commit makes it durable anyway. It saves an fsync
        # per claim: the milliseconds between new mail and its session.
        f"{lease_set} FROM chosen, (SELECT set_config('synchronous_commit', 'off', true)) AS lease_commit "
        f"WHERE {items}.{q('seq')} = chosen.seq "
        f"RETURNING chosen.turn, -chosen.priority, chosen.wrapped, chosen.{channel}, {select_list}"
    )


def sqlite_fronts(cursor: Any, q: Quote, table: str, turn_table: str, at: Any, limit: int) -> dict[Any, Any]:
    """Read every lane's front at ``at`` and return the ``limit`` items a claim takes,
    ``seq`` to due time, in the order it takes them (``fair_order``); move the
    channels' round-robin on to the channel served last."""
    items, turns = q(table), q(turn_table)
    cursor.execute(f"SELECT {q('last_channel')} FROM {turns} WHERE {q('id')} = 1")
    found = cursor.fetchone()
    after = "" if found is None else found[0]
    cursor.execute(f"WITH RECURSIVE {lanes_sql(q, items)} SELECT channel, priority FROM lanes")
    due = _due_in_lane_sql(q, items, "%s", "%s")
    fronts: list[tuple[str, int, Any, Any]] = []
    for channel, priority in cursor.fetchall():
        cursor.execute(due, [channel, priority, at, at, limit])
        fronts.extend((channel, priority, due_at, seq) for seq, due_at in cursor.fetchall())
    taken = fair_order(fronts, limit=limit, lane=lambda f: (f[0], f[1]), place=lambda f: (f[2], f[3]), after=after)
    if taken:
        last = taken[-1][0]
        cursor.execute(f"UPDATE {turns} SET {q('last_channel')} = %s WHERE {q('id')} = 1", [last])
        if cursor.rowcount == 0:
            cursor.execute(f"INSERT INTO {turns} ({q('id')}, {q('last_channel')}) VALUES (1, %s)", [last])
    return {seq: due_at for _, _, due_at, seq in taken}
