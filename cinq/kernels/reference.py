"""Naive attention, the ground truth of every kernel test: the full score matrix is materialised, in float64.

Positions follow the serving convention: a sequence's ``Lq`` queries are the *last* ``Lq`` of its ``Lk`` keys,
so query ``i`` sits at position ``Lk - Lq + i`` and (causally) sees keys ``0 .. Lk - Lq + i``. With ``Lq == Lk``
this is ordinary causal self-attention; with ``Lq == 1`` it is a decode step; in between, a prefill chunk
after a cached prefix. A tree-verification step (``AttentionMetadata.tree_mask``) replaces the causal mask of
its decode-like sequences by an explicit one.
"""

from __future__ import annotations

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import causal_mask, gather_context, tree_context_mask, window_mask


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        causal: bool = True, attn_mask: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one sequence. q: [Lq, Hq, D]; k, v: [Lk, Hkv, D] with Hq a multiple of Hkv (GQA).

    ``attn_mask`` (bool [Lq, Lk], True = visible; every row must see a key), when given, replaces ``causal``.
    Returns ``(out [Lq, Hq, D], lse [Hq, Lq])`` in float64; ``lse`` is the log-sum-exp of each query's scaled
    scores, the quantity FlashAttention keeps to merge partial results.
    """
    lq, lk = q.shape[0], k.shape[0]
    if attn_mask is not None and tuple(attn_mask.shape) != (lq, lk):
        raise InvalidParameterError(
            f"attention: attn_mask must be [{lq}, {lk}], got {list(attn_mask.shape)}", param="attn_mask")
    if attn_mask is None and causal and lq > lk:
        raise InvalidParameterError(f"attention: causal needs query length ({lq}) <= key length ({lk})", param="q")
    if q.shape[1] % k.shape[1]:
        raise InvalidParameterError(
            f"attention: query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})", param="q")
    group = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1)  # [Lk, Hq, D]
    vd = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kd).mul_(scale)  # [Hq, Lq, Lk]: the N x N matrix
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask.to(q.device), float("-inf"))
    elif causal:
        scores.masked_fill_(~causal_mask(lq, lk, q.device), float("-inf"))
    # softmax in place, so that the peak is one score matrix (the benchmark's N^2 column)
    row_max = scores.amax(dim=-1, keepdim=True)
    probs = scores.sub_(row_max).exp_()
    total = probs.sum(dim=-1, keepdim=True)
    probs.div_(total)
    return torch.einsum("hqk,khd->qhd", probs, vd), (row_max + total.log()).squeeze(-1)


def varlen_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, scale: float,
                               causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed variable-length batch: sequence b owns rows ``cu_seqlens[b]:cu_seqlens[b+1]`` of q and of k/v.

    Returns ``(out [Tq, Hq, D], lse [Hq, Tq])`` in float64.
    """
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float64, device=q.device)
    sq, sk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(sq) - 1):
        o, l = attention_reference(q[sq[b]:sq[b + 1]], k[sk[b]:sk[b + 1]], v[sk[b]:sk[b + 1]], scale, causal)
        out[sq[b]:sq[b + 1]], lse[:, sq[b]:sq[b + 1]] = o, l
    return out, lse


def paged_attention_reference(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The serving step: each sequence's new queries attend causally to its context read through its block table
    (the decode-like sequences of a tree step: to the context and their tree ancestors, ``meta.tree_mask``).

    query: [T, Hq, D]; kv_cache: [2, num_blocks, block_size, Hkv, D]. Returns float64 ``(out, lse)``. The metadata
    may live on another device than the tensors (a CUDA step checked on the CPU): it is read where they are.
    """
    out = torch.empty(query.shape, dtype=torch.float64, device=query.device)
    lse = torch.empty(query.shape[1], query.shape[0], dtype=torch.float64, device=query.device)
    starts = meta.query_start_loc.tolist()
    for i in range(meta.num_seqs):
        s, e = starts[i], starts[i + 1]
        k, v = gather_context(kv_cache, meta.block_tables[i].to(kv_cache.device), meta.seq_lens_cpu[i])
        tree = meta.seq_tree_mask(i)
        mask = None if tree is None else tree_context_mask(tree.to(query.device), meta.seq_lens_cpu[i])
        if meta.sliding_window is not None:  # the layer's window, on top of the causal (or tree) mask
            q_len, kv_len = e - s, meta.seq_lens_cpu[i]
            base = causal_mask(q_len, kv_len, query.device) if mask is None else mask
            mask = base & window_mask(q_len, kv_len, meta.sliding_window, query.device)
        out[s:e], lse[:, s:e] = attention_reference(query[s:e], k, v, scale, causal=True, attn_mask=mask)
    return out, lse
