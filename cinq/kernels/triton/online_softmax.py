"""The inner step that the prefill and decode kernels share: FlashAttention-2's online softmax over one K/V tile."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_update(s, v, m_i, l_i, acc, q, FP32_DOT: tl.constexpr):
    """Fold one tile into the running state. ``s``: scores [M, N] already in log2 units (scaled by log2 e);
    ``v``: the tile's values [N, D]; ``m_i`` / ``l_i``: running row max and sum of exp2; ``acc``: unnormalised
    output [M, D]. The old state is rescaled by exp2(m_old - m_new) so that every term shares the new max.
    Returns the new (m_i, l_i, acc). ``FP32_DOT``: multiply in float32 (fp32 models; the interpreter, whose
    bf16 dot is wrong)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no visible key yet (a draft row's split past its last key) keeps max -inf: subtract 0
    # instead, so that its terms are exp2(-inf) = 0 rather than NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    if FP32_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_i, acc
