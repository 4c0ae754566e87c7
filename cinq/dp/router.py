"""Which data-parallel replica gets a request: prefix affinity, falling back to the least-loaded replica.

Each replica has its own prefix cache, so a request whose prompt starts like an earlier one's is cheapest on the
replica that served that earlier request. The router keys prompts by the chained hash of their first full KV
blocks (the same ``hash_block`` chaining and block size the engine's prefix cache uses, so "same key" means "same
cached blocks"), remembers which replica each key last went to in a bounded LRU table, and sends a request to the
replica of its longest remembered prefix, as SGLang's cache-aware router does with its radix tree. Affinity
yields to balance: when that replica has ``balance_slack`` more requests in flight than the least-loaded one, the
request goes to the least-loaded replica instead (and the prefix now points there). ``random`` is the baseline
the benchmark compares against; ``least_loaded`` ignores prefixes.

Pure Python, no Ray: the caller passes the loads and which replicas may be chosen.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from cinq.engine.kv_cache import hash_block
from cinq.errors import InvalidParameterError

POLICIES = ("prefix", "least_loaded", "random")
# Why a replica was chosen (the label of the router's decision counter in /metrics).
REASONS = ("prefix_hit", "least_loaded", "random")


class NoReplicaError(RuntimeError):
    """Every replica is excluded (dead or already tried) for this request."""


@dataclass(slots=True)
class RouterConfig:
    """How requests are spread over replicas."""

    policy: str = "prefix"  # one of POLICIES
    block_size: int = 16  # the engine's KV block size: keys cover whole cached blocks
    max_prefix_blocks: int = 8  # how many leading blocks key a prompt (longer prompts share these)
    max_entries: int = 1 << 16  # affinity table bound (LRU)
    balance_slack: int = 4  # affinity holds while its replica has at most this many more in flight than the least
    seed: int | None = None  # of the random policy and of tie-breaking

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidParameterError(f"routing policy must be one of {list(POLICIES)}, got {self.policy!r}",
                                        "policy")
        for name, lo in (("block_size", 1), ("max_prefix_blocks", 1), ("max_entries", 1), ("balance_slack", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise InvalidParameterError(f"{name} must be an integer >= {lo}, got {value!r}", name)


@dataclass(slots=True)
class RouteDecision:
    replica: int
    reason: str  # one of REASONS
    matched_blocks: int = 0  # leading blocks of the prompt remembered for the chosen replica


class PrefixRouter:
    """Chooses a replica per request and remembers prompt prefixes (see the module docstring)."""

    def __init__(self, num_replicas: int, config: RouterConfig | None = None) -> None:
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise InvalidParameterError(f"num_replicas must be an integer >= 1, got {num_replicas!r}",
                                        "data_parallel_size")
        self.num_replicas = num_replicas
        self.config = config or RouterConfig()
        self._table: OrderedDict[int, int] = OrderedDict()  # prefix hash -> replica, least recently used first
        self._rng = random.Random(self.config.seed)
        self._next_tie = 0  # rotates ties among equally loaded replicas

    def __len__(self) -> int:
        return len(self._table)

    def prefix_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """Chained hashes of the prompt's first full blocks (at most ``max_prefix_blocks``); a prompt shorter
        than one block has none. The engine's prefix cache chains its blocks the same way, so equal keys mean the
        same cached blocks; the values themselves are only compared within this process (hash(None), the first
        block's parent, differs between processes before Python 3.12)."""
        bs = self.config.block_size
        hashes: list[int] = []
        parent: int | None = None
        for i in range(min(len(token_ids) // bs, self.config.max_prefix_blocks)):
            parent = hash_block(parent, tuple(token_ids[i * bs:(i + 1) * bs]))
            hashes.append(parent)
        return hashes

    def route(self, token_ids: Sequence[int], loads: Sequence[int], exclude: Collection[int] = ()) -> RouteDecision:
        """The replica for a prompt, given each replica's requests in flight; ``exclude``: replicas that may not
        be chosen (dead, or already failed this request). Raises ``NoReplicaError`` when none is left."""
        if len(loads) != self.num_replicas:
            raise ValueError(f"expected {self.num_replicas} loads, got {len(loads)}")
        eligible = [r for r in range(self.num_replicas) if r not in exclude]
        if not eligible:
            raise NoReplicaError("no live replica is left to serve the request")
        if self.config.policy == "random":
            return RouteDecision(self._rng.choice(eligible), "random")
        least = self._least_loaded(eligible, loads)
        if self.config.policy == "least_loaded":
            return RouteDecision(least, "least_loaded")
        hashes = self.prefix_hashes(token_ids)
        decision = RouteDecision(least, "least_loaded")
        for depth in range(len(hashes), 0, -1):  # the longest remembered prefix wins
            replica = self._table.get(hashes[depth - 1])
            if replica is not None and replica in eligible:
                if loads[replica] - loads[least] <= self.config.balance_slack:
                    decision = RouteDecision(replica, "prefix_hit", depth)
                break
        self._remember(hashes, decision.replica)
        return decision

    def forget_replica(self, replica: int) -> None:
        """Drop every prefix remembered for ``replica`` (it restarted with an empty cache)."""
        for key in [k for k, r in self._table.items() if r == replica]:
            del self._table[key]

    def _least_loaded(self, eligible: list[int], loads: Sequence[int]) -> int:
        low = min(loads[r] for r in eligible)
        ties = [r for r in eligible if loads[r] == low]
        # Rotate among ties so that an idle cluster spreads new prefixes instead of piling them on replica 0.
        choice = ties[self._next_tie % len(ties)]
        self._next_tie += 1
        return choice

    def _remember(self, hashes: list[int], replica: int) -> None:
        table = self._table
        for h in hashes:
            table[h] = replica
            table.move_to_end(h)
        while len(table) > self.config.max_entries:
            table.popitem(last=False)
