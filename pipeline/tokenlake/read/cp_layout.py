"""Context-parallel zigzag layout of response-aligned fields (dump-format.md 4.4).

Pure integer arithmetic, shared by the resolver (reassembly) and the dump generator (slicing),
so the two can never disagree about which rank owns which response positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (response_start, response_stop) pieces owned by one CP rank, in storage order (A then B).
Pieces = list[tuple[int, int]]


def chunk_size(total_length: int, cp_size: int, padded_length: int | None = None) -> int:
    """Chunk size C: ceil(T / 2S) for thd, ceil(M / 2S) for bshd (M = padded length).

    Examples:
        >>> chunk_size(20, 2)
        5
        >>> chunk_size(20, 2, padded_length=32)
        8
    """
    length = total_length if padded_length is None else padded_length
    return -(-length // (2 * cp_size))


def rank_pieces(
    total_length: int,
    response_length: int,
    cp_rank: int,
    cp_size: int,
    padded_length: int | None = None,
) -> Pieces:
    """Response-index ranges stored by `cp_rank`, in the order they are stored.

    Examples:
        >>> rank_pieces(20, 12, 0, 2)
        [(8, 12)]
        >>> rank_pieces(20, 12, 1, 2)
        [(0, 3), (3, 8)]
    """
    prompt_length = total_length - response_length
    c = chunk_size(total_length, cp_size, padded_length)
    chunks = (cp_rank, 2 * cp_size - 1 - cp_rank)
    pieces: Pieces = []
    for chunk in chunks:
        lo = max(chunk * c, prompt_length - 1)
        hi = min((chunk + 1) * c, total_length - 1)
        if lo < hi:
            pieces.append((lo - prompt_length + 1, hi - prompt_length + 1))
    return pieces


def rank_width(
    total_length: int,
    response_length: int,
    cp_rank: int,
    cp_size: int,
    padded_length: int | None = None,
) -> int:
    """Number of response positions stored by `cp_rank` (C_s).

    Examples:
        >>> [rank_width(20, 12, s, 2) for s in range(2)]
        [4, 8]
    """
    pieces = rank_pieces(total_length, response_length, cp_rank, cp_size, padded_length)
    return sum(stop - start for start, stop in pieces)


def slice_for_rank(
    full: np.ndarray,
    total_length: int,
    cp_rank: int,
    cp_size: int,
    padded_length: int | None = None,
) -> np.ndarray:
    """The slice a CP rank stores for a full response-aligned array (the writer's side)."""
    pieces = rank_pieces(total_length, len(full), cp_rank, cp_size, padded_length)
    if not pieces:
        return full[:0].copy()
    return np.concatenate([full[start:stop] for start, stop in pieces])


def assemble(
    slices: Sequence[np.ndarray],
    total_length: int,
    response_length: int,
    padded_length: int | None = None,
) -> np.ndarray | None:
    """Reassemble the full response from one slice per CP rank (index = cp_rank).

    Returns None when a slice does not have exactly the width its rank owns, which is how the
    reference refuses a layout it cannot trust (the caller flags `alignment_failed`). Positions
    no rank owns (prompt length 0, section 8.2) stay 0 here: `uncovered` says which they are,
    and the caller must treat them as unknown, never as data.

    Examples:
        >>> full = np.arange(12, dtype=np.float32)
        >>> parts = [slice_for_rank(full, 20, s, 2) for s in range(2)]
        >>> assemble(parts, 20, 12).tolist() == full.tolist()
        True
    """
    cp_size = len(slices)
    dtype = slices[0].dtype if slices else np.float32
    out = np.zeros(response_length, dtype=dtype)
    for cp_rank, stored in enumerate(slices):
        pieces = rank_pieces(total_length, response_length, cp_rank, cp_size, padded_length)
        if sum(stop - start for start, stop in pieces) != len(stored):
            return None
        offset = 0
        for start, stop in pieces:
            out[start:stop] = stored[offset : offset + stop - start]
            offset += stop - start
    return out


def uncovered(
    total_length: int, response_length: int, cp_size: int, padded_length: int | None = None
) -> np.ndarray:
    """Response positions no CP rank stores (bool [R]); only a prompt of length 0 has one.

    Examples:
        >>> uncovered(12, 12, 2).nonzero()[0].tolist()
        [0]
        >>> bool(uncovered(20, 12, 2).any())
        False
    """
    holes = np.ones(response_length, dtype=bool)
    for cp_rank in range(cp_size):
        for start, stop in rank_pieces(
            total_length, response_length, cp_rank, cp_size, padded_length
        ):
            holes[start:stop] = False
    return holes
