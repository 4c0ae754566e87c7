"""Bucketed row counts for the step's matrix multiplies, so a server sees a bounded set of GEMM shapes.

oneDNN (which runs torch's bf16 linears on CPU past the native small-row kernel) builds a primitive per distinct
problem shape and caches it twice, in ideep's and in oneDNN's LRU caches (1024 entries each); every primitive
holds its JIT code and buffers, about 0.3-0.8 MB on an AMX machine. A step's row count is its number of batched
tokens, which under mixed traffic takes almost every value up to ``max_num_batched_tokens``, times five weight
shapes: measured on cinq-tiny, server RSS grew by ~0.5-1 GiB over the first thousands of requests (malloc's
in-use bytes grew with it; Python's heap and free malloc memory did not), and a shape evicted from the full caches
must be rebuilt (~1 ms) the next time it comes. Rounding the rows up to ~4 sizes per power of two (at most
``MAX_PAD_ROWS - 1`` padding rows, so <= 25% and usually much less) leaves a few dozen shapes per weight that
stay cached.
"""

from __future__ import annotations

MAX_PAD_ROWS = 128  # the runner's scratch KV room for padding tokens is sized from this
# Up to 32 rows a step runs exactly as many: the native small-row kernels take them on the CPU (bf16 up to
# small_m_rows(), int4 up to 32, the int8-activation kernels further; no oneDNN primitive), and 32 exact sizes
# keep the set of shapes bounded where they do not. Padding them had cost up to 3 rows of 17-32 in every linear,
# and a padding sequence of several tokens beside one-token decodes made the step ragged, which Gemma 3's fused
# decode program does not take (batches 17-18, 21-22, 25-26 and 29-30 decoded on the Python layers).
EXACT_ROWS = 32


def bucket_rows(n: int) -> int:
    """The padded row count for ``n`` rows: ``n`` itself up to ``EXACT_ROWS``, else ``n`` rounded up to a multiple
    of a quarter of its power of two (capped at ``MAX_PAD_ROWS``)."""
    if n <= EXACT_ROWS:
        return n
    step = min(MAX_PAD_ROWS, 1 << max(n.bit_length() - 3, 0))
    return -(-n // step) * step
