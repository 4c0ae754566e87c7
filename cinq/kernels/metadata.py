"""AttentionMetadata: what one forward step needs to know to read and write the paged KV cache.

A step is a flat, variable-length batch of T new tokens from B sequences. Sequence i owns the new tokens
``query_start_loc[i]:query_start_loc[i+1]``; they sit at the last ``query_len`` positions of a context of
``seq_lens[i]`` tokens whose K/V live in the blocks ``block_tables[i]``. Decode-like sequences come first: the
first ``num_decodes`` each have exactly ``decode_query_len`` new tokens (1 for plain decoding, k + 1 when a
speculative step verifies k draft tokens), so backends batch them in their decode kernel, causal within those
rows; the rest are (chunked) prefills.

Tree verification (Medusa / EAGLE-2 candidate trees): the ``decode_query_len`` rows of each decode-like sequence
are then a flattened tree (row 0 the root, every node after its parent) and ``tree_mask`` ([q, q] bool, shared
by all decode-like sequences of the step) says which of them each row sees: row i attends to the whole cached
context (positions < seq_len - q) and to the rows j with ``tree_mask[i, j]`` (its ancestors and itself). Row r
still sits at KV position seq_len - q + r; the tree rows' rope positions (depths) are the caller's business.
Sequences past ``num_decodes`` are always causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer of the forward pass."""

    slot_mapping: torch.Tensor  # [T] int64: block_id * block_size + offset where each new token's K/V is stored
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative query lengths (cu_seqlens_q)
    seq_lens: torch.Tensor  # [B] int32, context length after this step (cached + new tokens)
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0 past a sequence's last block
    query_lens_cpu: list[int]  # host copies: backends branch on them without device syncs
    seq_lens_cpu: list[int]
    num_decodes: int  # the first num_decodes sequences have query_len == decode_query_len
    max_query_len: int
    max_seq_len: int
    block_size: int
    decode_query_len: int = 1  # query rows of each decode-like sequence
    # [q, q] bool on the step's device, or None (causal among the rows): tree_mask[i, j] = decode row i sees row j
    tree_mask: torch.Tensor | None = None

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_query_len

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @classmethod
    def from_lens(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int,
                  device: torch.device | str = "cpu", decode_query_len: int = 1,
                  tree_mask: torch.Tensor | None = None) -> AttentionMetadata:
        """Build the metadata of one step from host lists (tests, benchmarks, simple callers).

        Sequences must already be ordered decodes first; ``num_decodes`` counts the leading sequences with
        ``query_len == decode_query_len``. ``tree_mask`` (see the module docstring) is checked with
        ``check_tree_mask`` and moved to ``device``.
        """
        if not isinstance(decode_query_len, int) or decode_query_len < 1:
            raise InvalidParameterError(
                f"metadata: decode_query_len must be an integer >= 1, got {decode_query_len!r}",
                param="decode_query_len")
        if tree_mask is not None:
            check_tree_mask(tree_mask, decode_query_len)
            tree_mask = tree_mask.to(device)
        if not (len(query_lens) == len(seq_lens) == len(block_tables)):
            raise InvalidParameterError(
                f"metadata: query_lens ({len(query_lens)}), seq_lens ({len(seq_lens)}) and block_tables "
                f"({len(block_tables)}) must have one entry per sequence", param="query_lens")
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables):
            if not 0 < q_len <= s_len or -(-s_len // block_size) > len(table):
                raise InvalidParameterError(
                    f"metadata: need 0 < query_len ({q_len}) <= seq_len ({s_len}) <= {len(table)} blocks x "
                    f"{block_size}", param="seq_lens")
            slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
        width = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == decode_query_len:
            num_decodes += 1
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device).view(len(block_tables), width),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            num_decodes=num_decodes,
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            block_size=block_size,
            decode_query_len=decode_query_len,
            tree_mask=tree_mask,
        )


def check_tree_mask(tree_mask: torch.Tensor, decode_query_len: int) -> None:
    """Raise ``InvalidParameterError`` (param ``tree_mask``) unless ``tree_mask`` is a bool [q, q] tensor,
    q = ``decode_query_len``, True on the diagonal and False above it (a row sees only itself and earlier rows).

    Reads the mask's values: on a GPU that is a device sync, so callers check once per tree, not per layer.
    """
    if not isinstance(tree_mask, torch.Tensor) or tree_mask.dtype != torch.bool:
        what = tree_mask.dtype if isinstance(tree_mask, torch.Tensor) else type(tree_mask).__name__
        raise InvalidParameterError(f"metadata: tree_mask must be a bool tensor, got {what}", param="tree_mask")
    q = decode_query_len
    if tuple(tree_mask.shape) != (q, q):
        raise InvalidParameterError(
            f"metadata: tree_mask must be [decode_query_len, decode_query_len] = [{q}, {q}], got "
            f"{list(tree_mask.shape)}", param="tree_mask")
    host = tree_mask.cpu()
    if not bool(host.diagonal().all()):
        raise InvalidParameterError("metadata: tree_mask must be True on the diagonal (every row sees itself)",
                                    param="tree_mask")
    if bool(host.triu(diagonal=1).any()):
        raise InvalidParameterError(
            "metadata: tree_mask must be False above the diagonal (a row sees only itself and earlier rows: "
            "a node's parent comes before it)", param="tree_mask")


def tree_mask_from_parents(parents: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """The [q, q] ``tree_mask`` of a flattened tree: ``parents[i]`` is row i's parent row (< i), -1 for the root
    (row 0). Row i sees itself and its ancestors."""
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise InvalidParameterError(
            f"metadata: parents must start with -1 (the root) and have 0 <= parents[i] < i, got {parents}",
            param="parents")
    q = len(parents)
    mask = torch.eye(q, dtype=torch.bool)
    for i in range(1, q):  # parents come first, so their rows are complete
        mask[i] |= mask[parents[i]]
    return mask.to(device)
