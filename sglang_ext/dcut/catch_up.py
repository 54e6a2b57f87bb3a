"""Row layout of the catch-up draft extend after draft-off steps (pure; torch only).

While D-Cut keeps drafting off (``--dcut-draft-off-extend defer``), the draft extend of each
draft-off step is skipped: request ``b`` collects ``pending[b]`` rows -- per skipped step, the
token the draft reads at that position, the target's captured hidden state and the KV slot.
Before drafting resumes, one draft-off step runs its draft extend over every request's pending
rows plus its own row, in one forward: the draft then holds what the skipped extends would have
written, and its last row gives the next draft's inputs, as after an ordinary extend.

SGLang's draft extend reads a uniform window of ``K`` rows per request and the row ``b * K +
accept_lens[b] - 1`` of each; :func:`catch_up_layout` lays the ragged rows out in such a window.
Request ``b``'s window holds its ``pending[b] + 1`` rows in order, then repeats the last one
(same token, hidden state, position and slot): a forward over the whole window (CUDA graphs,
``--dcut-draft-extend window``) then writes the same key and value to that slot twice, since a
one-layer draft's keys and values depend only on the row's own inputs, and the padding rows'
outputs are never selected. The accepted-rows extend runs only the real rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CatchUpLayout:
    """Where each window row of a catch-up draft extend comes from.

    Attributes
    ----------
    width : int
        ``K``: rows per request in the window (``max(pending) + 1``).
    source : torch.Tensor
        ``# [batch_size, width]`` int64: row ``j`` of request ``b`` is its own row
        ``source[b, j]`` (``0 .. pending[b]``, the last one is this step's).
    accept_lens : torch.Tensor
        ``# [batch_size]`` int32: real rows per request, ``pending + 1``.
    """

    width: int
    source: torch.Tensor  # [batch_size, width]
    accept_lens: torch.Tensor  # [batch_size]

    def flat_index(self, row_offsets: torch.Tensor) -> torch.Tensor:  # [batch_size * width] int64
        """Indices into the requests' rows concatenated in batch order, whose exclusive offsets
        are ``row_offsets`` (``# [batch_size]``, request ``b`` starts at ``row_offsets[b]``).

        Examples
        --------
        >>> lay = catch_up_layout(torch.tensor([2, 0, 1]))
        >>> lay.flat_index(torch.tensor([0, 3, 4])).tolist()
        [0, 1, 2, 3, 3, 3, 4, 5, 5]
        """
        return (row_offsets.to(torch.int64).view(-1, 1) + self.source).reshape(-1)


def catch_up_layout(
    pending: torch.Tensor,  # [batch_size] int, skipped rows per request (>= 0)
) -> CatchUpLayout:
    """The window layout of a catch-up draft extend (see the module docstring).

    Examples
    --------
    >>> lay = catch_up_layout(torch.tensor([2, 0, 1]))
    >>> lay.width, lay.source.tolist(), lay.accept_lens.tolist()
    (3, [[0, 1, 2], [0, 0, 0], [0, 1, 1]], [3, 1, 2])
    """
    counts = pending.to(torch.int64).reshape(-1)
    if counts.numel() == 0:
        raise ValueError("a catch-up draft extend needs at least one request")
    if bool((counts < 0).any()):
        raise ValueError(f"pending row counts must be >= 0, got {counts.tolist()}")
    width = int(counts.max()) + 1
    col = torch.arange(width, dtype=torch.int64).view(1, -1)  # [1, width]
    source = torch.minimum(col, counts.view(-1, 1))  # [batch_size, width]
    return CatchUpLayout(width=width, source=source, accept_lens=(counts + 1).to(torch.int32))


def row_offsets(
    counts: torch.Tensor,  # [batch_size] int, rows per request
) -> torch.Tensor:  # [batch_size] int64, exclusive offsets
    """Exclusive prefix sums: where each request's rows start in the concatenation.

    Examples
    --------
    >>> row_offsets(torch.tensor([3, 1, 2])).tolist()
    [0, 3, 4]
    """
    c = counts.to(torch.int64).reshape(-1)
    return torch.cumsum(c, 0) - c
