"""Engine stats of several replicas as one ``EngineStats``: what /metrics, /stats and the stats log show for a
data-parallel server (the per-replica figures are in the router's own metrics)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cinq.outputs import EngineStats, SpecDecodingStats

# Fields that describe the present (not counters since start): a replica that died contributes none of them.
GAUGES = ("num_running", "num_waiting", "kv_cache_usage", "num_kv_blocks", "kv_slots_held", "kv_tokens_held")


def sum_stats(snapshots: Iterable[EngineStats]) -> EngineStats:
    """Counters and queue lengths added up; KV usage as the fraction of all replicas' blocks in use."""
    total = EngineStats()
    used_blocks = 0.0
    for s in snapshots:
        for f in dataclasses.fields(EngineStats):
            value = getattr(s, f.name)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(total, f.name, getattr(total, f.name) + value)
        used_blocks += s.kv_cache_usage * s.num_kv_blocks
        for reason, n in s.finished_by_reason.items():
            total.finished_by_reason[reason] = total.finished_by_reason.get(reason, 0) + n
        per_pos = total.spec_decode_num_accepted_tokens_per_pos
        for pos, n in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
            if pos < len(per_pos):
                per_pos[pos] += n
            else:
                per_pos.append(n)
        for language, c in s.spec_decode_by_language.items():
            mine = total.spec_decode_by_language.setdefault(language, SpecDecodingStats())
            mine.num_drafts += c.num_drafts
            mine.num_draft_tokens += c.num_draft_tokens
            mine.num_accepted_tokens += c.num_accepted_tokens
    total.kv_cache_usage = used_blocks / total.num_kv_blocks if total.num_kv_blocks else 0.0
    return total


def without_gauges(stats: EngineStats) -> EngineStats:
    """The counters of a replica that died, kept so that the server's totals do not drop when it restarts."""
    return dataclasses.replace(stats, **{name: type(getattr(stats, name))() for name in GAUGES})
