"""The ORM store's claim: the due items of every lane, channels in turn.

An item's lane is its channel and its priority. The index ``bumail_queue_items_lane``
on ``(channel, priority, next_attempt_at, seq)`` keeps each lane's items together,
earliest due first, so a lane's due items are the front of its range however many of
its items wait for later (retries, mail sent with ``at=``, leased items, whose
``next_attempt_at`` is their lease's end). A claim:

1. finds the lanes by skipping through that index: the next lane is the first entry
   above the last one found, one probe each, whatever the number of items;
2. counts each lane's due items, as far as the claim could take from it;
3. works out each lane's share (``items.fair_shares``: channels in turn from the one
   after the store's last claim, the higher priority first), reads exactly those,
   earliest due first, and leases them.

Its cost is a probe or two per lane and the items it takes: logarithmic in the
queue's size, linear in its lanes (``docs/stores.md``).

On PostgreSQL the counts are one statement and the claim another, whose row locks
skip what another claimer holds. On SQLite they are a statement per lane under the
database's write lock, in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bumail_queue.items import fair_order, fair_shares

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


def _due_in_lane_sql(q: Quote, items: str, channel: str, priority: str, *, columns: str = "", lock: str = "") -> str:
    """The first ``%s`` (a number) items due at ``%s`` (now, twice) of one lane, earliest first."""
    return (
        f"SELECT {columns or q('seq') + ', ' + q('next_attempt_at')} FROM {items} "
        f"WHERE {q('channel')} = {channel} AND {q('priority')} = {priority} AND {q('next_attempt_at')} <= %s "
        f"AND ({q('lease_owner')} IS NULL OR {q('lease_expires_at')} <= %s) "
        f"ORDER BY {q('next_attempt_at')}, {q('seq')} LIMIT %s{lock}"
    )


def count_cap(limit: int, channels_due: int) -> int:
    """How far a lane's due items need counting: a claim takes at least one item of each
    channel with due mail, so no channel more than ``limit - channels_due + 1``."""
    return max(1, limit - channels_due + 1)


def shares_of(counted: list[tuple[str, int, int]], limit: int, after: str) -> list[tuple[str, int, int]]:
    """Each lane's share of a claim (``fair_shares``), as ``(channel, priority, share)``."""
    return [
        (channel, priority, share)
        for (channel, priority), share in fair_shares(counted, limit=limit, after=after).items()
    ]


def postgres_count_sql(q: Quote, table: str) -> str:
    """The first of a claim's two statements on PostgreSQL: every lane with due items, and
    how many (as far as a claim could take from it).

    Parameters: now, now (has a lane due items), limit (the cap), now, now. A row per
    lane with due items: its channel, its priority, its count; none when nothing is due.
    """
    items = q(table)
    due = _due_in_lane_sql(q, items, "lanes.channel", "lanes.priority", columns="1")
    return (
        f"WITH RECURSIVE {lanes_sql(q, items)}, "
        # A probe of each lane's front: does it hold an item due now?
        f"due_lanes AS (SELECT lanes.channel, lanes.priority FROM lanes "
        f"WHERE EXISTS ({due.replace('LIMIT %s', 'LIMIT 1')})), "
        f"cap AS (SELECT greatest(1, %s - count(DISTINCT channel) + 1) AS n FROM due_lanes) "
        f"SELECT due_lanes.channel, due_lanes.priority, counted.n "
        f"FROM due_lanes, cap CROSS JOIN LATERAL (SELECT count(*) AS n FROM ("
        f"{due.replace('lanes.channel', 'due_lanes.channel').replace('lanes.priority', 'due_lanes.priority').replace('LIMIT %s', 'LIMIT cap.n')}"
        f") AS front) AS counted"
    )


def postgres_claim_sql(q: Quote, table: str, lease_set: str, select_list: str) -> str:
    """The second: each lane's share of the claim, locked, ordered and leased.

    Parameters, in order: the lanes' channels, priorities and shares (three arrays),
    now, now, the claim's limit, the channel the store's last claim ended with, then
    ``lease_set``'s owner, expiry, expiry. Each returned row is the item's place in the
    claim's order (its last value its channel), then ``select_list``'s columns.
    """
    items = q(table)
    # Each lane's share is locked as it is read, skipping rows another claimer holds:
    # two claimers read past each other, and neither waits. A row leased meanwhile
    # fails the re-check of its due time and lease, and the read goes on past it.
    due = _due_in_lane_sql(q, items, "lane.channel", "lane.priority", lock=" FOR UPDATE SKIP LOCKED").replace(
        "LIMIT %s", "LIMIT lane.share"
    )
    # Channel names are compared byte by byte (ASCII), as every store compares them.
    channel = 'channel COLLATE "C"'
    return (
        f"WITH fronts AS (SELECT front.{q('seq')} AS seq, front.{q('next_attempt_at')} AS due_at, "
        f"lane.channel, lane.priority FROM unnest(%s::varchar[], %s::smallint[], %s::integer[]) "
        # No more than the claim's limit, which the shares add up to: said here, it
        # keeps the planner to a join on the primary key for so few rows.
        f"AS lane(channel, priority, share) CROSS JOIN LATERAL ({due}) AS front LIMIT %s), "
        f"ranked AS (SELECT seq, due_at, priority, channel, row_number() OVER "
        f"(PARTITION BY channel ORDER BY priority DESC, due_at, seq) AS turn, "
        f'{channel} <= (%s::varchar COLLATE "C") AS wrapped FROM fronts) '
        # The lease is committed without waiting for the disk (synchronous_commit off
        # for this statement's transaction alone): a lease a database crash forgets
        # only makes the item claimable again, as a worker's crash does, and the
        # worker's next synchronous commit makes it durable anyway. It saves an fsync
        # per claim: the milliseconds between new mail and its session.
        f"{lease_set} FROM ranked, (SELECT set_config('synchronous_commit', 'off', true)) AS lease_commit "
        f"WHERE {items}.{q('seq')} = ranked.seq "
        f"RETURNING ranked.turn, -ranked.priority, ranked.wrapped, ranked.{channel}, {select_list}"
    )


def sqlite_fronts(cursor: Any, q: Quote, table: str, at: Any, limit: int, after: str) -> dict[Any, Any]:
    """Count each lane's due items, read each lane's share (``fair_shares``) and return
    them, ``seq`` to due time, in the order the claim takes them (``fair_order``)."""
    items = q(table)
    cursor.execute(f"WITH RECURSIVE {lanes_sql(q, items)} SELECT channel, priority FROM lanes")
    count = f"SELECT count(*) FROM ({_due_in_lane_sql(q, items, '%s', '%s', columns='1')}) AS front"
    due_lanes = []
    for channel, priority in cursor.fetchall():
        cursor.execute(count, [channel, priority, at, at, 1])
        if cursor.fetchone()[0]:
            due_lanes.append((channel, priority))
    cap = count_cap(limit, len({channel for channel, _ in due_lanes}))
    counted = []
    for channel, priority in due_lanes:
        if cap > 1:
            cursor.execute(count, [channel, priority, at, at, cap])
            counted.append((channel, priority, cursor.fetchone()[0]))
        else:
            counted.append((channel, priority, 1))
    read = _due_in_lane_sql(q, items, "%s", "%s")
    fronts: list[tuple[str, int, Any, Any]] = []
    for (channel, priority), share in fair_shares(counted, limit=limit, after=after).items():
        cursor.execute(read, [channel, priority, at, at, share])
        fronts.extend((channel, priority, due_at, seq) for seq, due_at in cursor.fetchall())
    taken = fair_order(fronts, limit=limit, lane=lambda f: (f[0], f[1]), place=lambda f: (f[2], f[3]), after=after)
    return {seq: (due_at, channel) for channel, _, due_at, seq in taken}
