"""AttentionMetadata: what one forward step needs to know to read and write the paged KV cache.

A step is a flat, variable-length batch of T new tokens from B sequences. Sequence i owns the new tokens
``query_start_loc[i]:query_start_loc[i+1]``; they sit at the last ``query_len`` positions of a context of
``seq_lens[i]`` tokens whose K/V live in the blocks ``block_tables[i]``. Decode-like sequences come first: the
first ``num_decodes`` each have exactly ``decode_query_len`` new tokens (1 for plain decoding, k + 1 when a
speculative step verifies k draft tokens), so backends batch them in their decode kernel, causal within those
rows; the rest are (chunked) prefills.

Tree verification (Medusa / EAGLE-2 candidate trees): the ``decode_query_len`` rows of each decode-like sequence
are then a flattened tree (row 0 the root, every node after its parent) and ``tree_mask`` says which of them each
row sees: row i attends to the whole cached context (positions < seq_len - q) and to the rows j with
``tree_mask[i, j]`` (its ancestors and itself). Two forms: ``[q, q]`` bool, one tree shared by all decode-like
sequences of the step (a static Medusa tree), or ``[num_decodes, q, q]`` bool, sequence s using ``tree_mask[s]``
(EAGLE-2 dynamic trees: every request its own shape, all with the same node count q). Row r still sits at KV position
seq_len - q + r; the tree rows' rope positions (depths) are the caller's business. Sequences past
``num_decodes`` are always causal.
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
    # True when the sequences after the first num_decodes are decode-like too, with other row counts (requests of a
    # speculative step verifying different numbers of drafts, or none; the padding sequence), each at most
    # RAGGED_MAX_ROWS rows: the CPU kernels then attend every sequence from the pages with its own row count
    # (query_start_loc), in the fused decode step as in the layers' tail path
    ragged_decodes: bool = False
    # bool on the step's device, [q, q] (shared) or [num_decodes, q, q] (per sequence), or None (causal among the
    # rows): tree_mask[(s,) i, j] = row i of decode-like sequence s sees its row j
    tree_mask: torch.Tensor | None = None
    # the calling layer's sliding window (cinq/layers/attention.py sets it per layer): query position p sees
    # context positions > p - sliding_window only; None: the whole context
    sliding_window: int | None = None
    # KV cache groups (cinq/engine/kv_cache_groups.py: a model mixing full and sliding-window layers): per group,
    # its block tables [B, w_g] and slots [T]; a layer of group g > 0 reads entry g instead of the two above (which
    # are group 0's). None: one group, every layer reads block_tables / slot_mapping
    group_block_tables: list[torch.Tensor] | None = None
    group_slot_mapping: list[torch.Tensor] | None = None
    # the inputs (shapes, dtypes, devices) paged.check_inputs last accepted with this metadata: every layer of a
    # step passes the same ones, so the step is validated once, not per layer. Whoever rewrites the metadata in
    # place for a new step (StepBuffers.fill) clears it
    checked_inputs: tuple | None = None

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_query_len

    def seq_tree_mask(self, seq: int) -> torch.Tensor | None:
        """Sequence ``seq``'s [q, q] tree mask (a view, no copy), or None: no tree step, or not decode-like."""
        tree = self.tree_mask
        if tree is None or seq >= self.num_decodes:
            return None
        return tree[seq] if tree.dim() == 3 else tree

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
        ``query_len == decode_query_len``. ``tree_mask`` ([q, q] or [num_decodes, q, q], see the module
        docstring) is checked with ``check_tree_mask`` and moved to ``device``.
        """
        if not isinstance(decode_query_len, int) or decode_query_len < 1:
            raise InvalidParameterError(
                f"metadata: decode_query_len must be an integer >= 1, got {decode_query_len!r}",
                param="decode_query_len")
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
        if tree_mask is not None:
            check_tree_mask(tree_mask, decode_query_len, num_decodes)
            tree_mask = tree_mask.to(device)
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


def check_tree_mask(tree_mask: torch.Tensor, decode_query_len: int, num_decodes: int | None = None) -> None:
    """Raise ``InvalidParameterError`` (param ``tree_mask``) unless ``tree_mask`` is a bool tensor [q, q] (shared)
    or [n, q, q] (per sequence; n == ``num_decodes`` when that is given), q = ``decode_query_len``, every [q, q]
    slice True on the diagonal and False above it (a row sees only itself and earlier rows).

    Reads the mask's values: on a GPU that is a device sync, so callers check once per tree, not per layer.
    """
    if not isinstance(tree_mask, torch.Tensor) or tree_mask.dtype != torch.bool:
        what = tree_mask.dtype if isinstance(tree_mask, torch.Tensor) else type(tree_mask).__name__
        raise InvalidParameterError(f"metadata: tree_mask must be a bool tensor, got {what}", param="tree_mask")
    q = decode_query_len
    shape = tuple(tree_mask.shape)
    if shape[-2:] != (q, q) or tree_mask.dim() not in (2, 3):
        raise InvalidParameterError(
            f"metadata: tree_mask must be [decode_query_len, decode_query_len] = [{q}, {q}] (shared) or "
            f"[num_decodes, {q}, {q}] (per sequence), got {list(shape)}", param="tree_mask")
    if tree_mask.dim() == 3 and num_decodes is not None and shape[0] != num_decodes:
        raise InvalidParameterError(
            f"metadata: a per-sequence tree_mask needs one [{q}, {q}] slice per decode-like sequence: "
            f"[{num_decodes}, {q}, {q}], got {list(shape)}", param="tree_mask")
    host = tree_mask.cpu().reshape(-1, q, q)

    def where(bad: torch.Tensor) -> str:  # [n] bool: which slice is wrong, for a per-sequence mask
        return f" (sequence {int(bad.nonzero()[0])})" if tree_mask.dim() == 3 else ""

    blind = ~host.diagonal(dim1=-2, dim2=-1).all(dim=-1)  # [n]: some row does not see itself
    if bool(blind.any()):
        raise InvalidParameterError(
            f"metadata: tree_mask must be True on the diagonal (every row sees itself){where(blind)}",
            param="tree_mask")
    ahead = host.triu(diagonal=1).flatten(1).any(dim=-1)  # [n]: some row sees a later row
    if bool(ahead.any()):
        raise InvalidParameterError(
            "metadata: tree_mask must be False above the diagonal (a row sees only itself and earlier rows: "
            f"a node's parent comes before it){where(ahead)}", param="tree_mask")


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


def depths(parents: list[int]) -> list[int]:
    """Each row's depth in a flattened tree (``parents`` as in ``tree_mask_from_parents``; the root is 0): the
    tree rows' rope positions are the sequence's next position plus their depth."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def tree_masks_from_parents(parents_per_seq: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """The per-sequence [n, q, q] ``tree_mask`` of n flattened trees, one parent array each (see
    ``tree_mask_from_parents``); all must have the same length q, the step's ``decode_query_len`` (EAGLE-2
    keeps the same number of nodes for every request; only the shapes differ)."""
    lengths = {len(p) for p in parents_per_seq}
    if len(lengths) != 1:
        raise InvalidParameterError(
            f"metadata: parents_per_seq must hold at least one parent array, all of one length, got lengths "
            f"{[len(p) for p in parents_per_seq]}", param="parents")
    return torch.stack([tree_mask_from_parents(p) for p in parents_per_seq]).to(device)
