"""Raw logprobs of chosen tokens in the engine's ``TokenLogprobs`` shape (sampled, verified and prompt tokens)."""

from __future__ import annotations

import torch

from cinq.step.runner_output import TokenLogprobs


def token_logprobs(logprobs: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """Row j of ``logprobs`` [n, V] scored ``tokens[j]``: its logprob, its rank and the top ``k``."""
    targets = torch.tensor(tokens, device=logprobs.device)
    chosen = logprobs.gather(1, targets[:, None]).squeeze(1)
    ranks = ((logprobs > chosen[:, None]).sum(-1) + 1).tolist()
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
    top_ids_l = top_ids.tolist() if k else [[]] * len(tokens)
    top_vals_l = top_vals.tolist() if k else [[]] * len(tokens)
    return [TokenLogprobs(t, c, r, i, v) for t, c, r, i, v in zip(tokens, chosen.tolist(), ranks, top_ids_l,
                                                                   top_vals_l)]
