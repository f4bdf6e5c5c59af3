"""``items.fair_order`` (the order every store claims in) and ``items.fair_shares`` (how a
store that counts before it reads takes the same items)."""

from __future__ import annotations

import random

import pytest

from bumail_queue.items import fair_order, fair_shares


def lane(item):
    return item[0], item[1]


def place(item):
    return item[2], item[3]


def test_channels_take_turns_and_the_higher_priority_goes_first_in_each():
    items = [
        ("bulk", 0, 1, 1), ("bulk", 0, 2, 2), ("bulk", 0, 3, 3),
        ("alerts", 0, 9, 4), ("bulk", 5, 8, 5), ("alerts", -1, 0, 6),
    ]  # fmt: skip
    taken = fair_order(items, limit=6, lane=lane, place=place)
    # Turn 1: bulk's priority 5 before alerts' 0; turn 2: bulk's earliest, then alerts' -1.
    assert [item[3] for item in taken] == [5, 4, 1, 6, 2, 3]


def test_the_round_robin_starts_after_the_channel_given():
    items = [(channel, 0, 0, n) for n, channel in enumerate("abcd")]
    assert [item[0] for item in fair_order(items, limit=4, lane=lane, place=place, after="b")] == ["c", "d", "a", "b"]
    assert [item[0] for item in fair_order(items, limit=2, lane=lane, place=place, after="d")] == ["a", "b"]


def test_nothing_is_taken_by_a_claim_of_no_items():
    assert fair_order([("a", 0, 0, 1)], limit=0, lane=lane, place=place) == []
    assert fair_shares([("a", 0, 3)], limit=0) == {}


@pytest.mark.parametrize("seed", range(20))
def test_the_shares_of_the_counts_take_the_items_fair_order_takes(seed):
    rng = random.Random(seed)
    for _ in range(100):
        items, seq = [], 0
        for channel in range(rng.randint(1, 6)):
            for priority in rng.sample(range(-3, 4), rng.randint(1, 3)):
                for _ in range(rng.randint(0, 8)):
                    seq += 1
                    items.append((f"c{channel}", priority, rng.randint(0, 20), seq))
        limit = rng.randint(1, 25)
        after = rng.choice(["", "c0", "c2", "c5", "zz"])
        counts: dict[tuple[str, int], int] = {}
        for item in items:
            counts[lane(item)] = counts.get(lane(item), 0) + 1
        shares = fair_shares([(c, p, n) for (c, p), n in counts.items()], limit=limit, after=after)
        taken = [
            item
            for key, share in shares.items()
            for item in sorted((i for i in items if lane(i) == key), key=place)[:share]
        ]
        assert sorted(taken) == sorted(fair_order(items, limit=limit, lane=lane, place=place, after=after))


def test_a_count_stopped_at_the_limit_is_enough():
    # 10 channels of 1,000 due each: a claim of 50 takes 5 of each, whatever counted.
    counted = [(f"c{n}", 0, 1000) for n in range(10)]
    capped = [(f"c{n}", 0, 41) for n in range(10)]  # counted no further than 50 - 10 + 1
    assert fair_shares(counted, limit=50) == fair_shares(capped, limit=50) == {(f"c{n}", 0): 5 for n in range(10)}
