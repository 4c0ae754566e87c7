"""PrefixRouter without Ray: affinity, the least-loaded fallback, balance, bounds, forgetting a replica, and the
prefix-cache hit rate it buys on a shared-prefix workload compared with random routing."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from cinq.dp.router import NoReplicaError, PrefixRouter, RouterConfig
from cinq.engine.kv_cache import hash_block
from cinq.errors import InvalidParameterError

BS = 4


def router(n: int = 2, **kw: object) -> PrefixRouter:
    return PrefixRouter(n, RouterConfig(block_size=BS, seed=0, **kw))  # type: ignore[arg-type]


def prompt(prefix: int, suffix: int, prefix_blocks: int = 2) -> list[int]:
    return [1000 * prefix + i for i in range(prefix_blocks * BS)] + [suffix, suffix + 1]


def test_prefix_hashes_chain_like_the_kv_cache() -> None:
    ids = list(range(11))  # two full blocks of 4, three tokens left over
    h0 = hash_block(None, (0, 1, 2, 3))
    assert router().prefix_hashes(ids) == [h0, hash_block(h0, (4, 5, 6, 7))]
    assert router(max_prefix_blocks=1).prefix_hashes(ids) == [h0]
    assert router().prefix_hashes([1, 2, 3]) == []


def test_same_prefix_goes_to_the_same_replica() -> None:
    r = router(4)
    first = r.route(prompt(7, 1), [0, 0, 0, 0])
    assert first.reason == "least_loaded"
    # The other replicas are no busier (within the slack): affinity wins over the idle ones.
    again = r.route(prompt(7, 2), [0, 0, 0, 0])
    assert (again.replica, again.reason, again.matched_blocks) == (first.replica, "prefix_hit", 2)


def test_new_prefixes_spread_over_idle_replicas() -> None:
    r = router(3)
    chosen = {r.route(prompt(p, 0), [0, 0, 0]).replica for p in range(3)}
    assert chosen == {0, 1, 2}


def test_longest_remembered_prefix_wins() -> None:
    r = router(2)
    short = [1, 2, 3, 4] + [9, 9, 9, 9]
    r.route(short, [0, 0])  # goes to one replica; remembers its first block there
    other = r.route([1, 2, 3, 4] + [5, 5, 5, 5], [5, 0])  # first block matches; too busy -> least loaded
    assert other.reason == "least_loaded" and other.replica == 1
    # Both blocks of that prompt now point at replica 1.
    d = r.route([1, 2, 3, 4] + [5, 5, 5, 5, 0], [0, 0])
    assert (d.replica, d.matched_blocks) == (1, 2)


def test_affinity_yields_to_balance_past_the_slack() -> None:
    r = router(2, balance_slack=2)
    home = r.route(prompt(3, 0), [0, 0]).replica
    loads = [0, 0]
    loads[home] = 2
    assert r.route(prompt(3, 1), loads).replica == home  # 2 more in flight: within the slack
    loads[home] = 3
    moved = r.route(prompt(3, 2), loads)
    assert moved.replica != home and moved.reason == "least_loaded"
    # The prefix now points at the replica it moved to.
    assert r.route(prompt(3, 3), [0, 0]).replica == moved.replica


def test_excluded_replicas_are_never_chosen() -> None:
    r = router(3)
    home = r.route(prompt(1, 0), [0, 0, 0]).replica
    d = r.route(prompt(1, 1), [0, 0, 0], exclude={home})
    assert d.replica != home
    with pytest.raises(NoReplicaError):
        r.route(prompt(1, 2), [0, 0, 0], exclude={0, 1, 2})


def test_forget_replica_drops_its_prefixes() -> None:
    r = router(2)
    home = r.route(prompt(1, 0), [0, 0]).replica
    other = r.route(prompt(2, 0), [0, 0]).replica
    assert home != other
    r.forget_replica(home)
    assert len(r) == 2  # prompt 2's two blocks remain
    assert r.route(prompt(1, 1), [0, 0]).reason == "least_loaded"
    assert r.route(prompt(2, 1), [0, 0]).reason == "prefix_hit"


def test_table_is_bounded_lru() -> None:
    r = router(2, max_entries=4)
    for p in range(5):
        r.route(prompt(p, 0), [0, 0])
    assert len(r) == 4  # two prompts of two blocks each: the oldest three were evicted
    assert r.route(prompt(4, 1), [0, 0]).reason == "prefix_hit"
    assert r.route(prompt(0, 1), [0, 0]).reason == "least_loaded"


def test_random_and_least_loaded_policies_ignore_prefixes() -> None:
    least = router(3, policy="least_loaded")
    assert least.route(prompt(1, 0), [2, 0, 1]).replica == 1
    assert least.route(prompt(1, 0), [2, 5, 1]).replica == 2
    rand = router(3, policy="random")
    reasons = {rand.route(prompt(1, i), [0, 0, 0]).reason for i in range(10)}
    assert reasons == {"random"}
    assert {rand.route(prompt(1, i), [0, 0, 0]).replica for i in range(50)} == {0, 1, 2}


def test_bad_config_names_the_field() -> None:
    with pytest.raises(InvalidParameterError) as e:
        RouterConfig(policy="round_robin")
    assert e.value.param == "policy"
    with pytest.raises(InvalidParameterError) as e:
        RouterConfig(max_entries=0)
    assert e.value.param == "max_entries"
    with pytest.raises(InvalidParameterError) as e:
        PrefixRouter(0)
    assert e.value.param == "data_parallel_size"


def simulated_hit_rate(policy: str, seed: int) -> float:
    """Blocks found cached over blocks looked up, for 2 replicas whose LRU prefix caches each hold 20 blocks,
    serving 8 system prompts of 4 blocks (32 blocks in all: they fit in two replicas, not in one)."""
    r = PrefixRouter(2, RouterConfig(policy=policy, block_size=BS, seed=seed + 1))  # not the workload's stream
    caches: list[OrderedDict[int, None]] = [OrderedDict(), OrderedDict()]
    rng = random.Random(-seed)
    hits = queries = 0
    for i in range(400):
        ids = prompt(rng.randrange(8), i, prefix_blocks=4)
        replica = r.route(ids, [0, 0]).replica
        cache = caches[replica]
        for h in r.prefix_hashes(ids):
            queries += 1
            if h in cache:
                hits += 1
                cache.move_to_end(h)
            else:
                cache[h] = None
                if len(cache) > 20:
                    cache.popitem(last=False)
    return hits / queries


def test_prefix_affinity_raises_the_hit_rate_over_random_routing() -> None:
    for seed in range(3):
        affinity, rand = simulated_hit_rate("prefix", seed), simulated_hit_rate("random", seed)
        # Affinity keeps each system prompt on one replica; random routing makes both replicas hold all eight.
        assert affinity > rand + 0.2, (seed, affinity, rand)
