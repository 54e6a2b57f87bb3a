"""Per-position draft observations of every request slot, kept until SpecExit reads them (pure torch).

The ``draft-confidence`` signal of a committed token is computed by a draft extend
(:mod:`sglang_ext.specexit.draft_confidence`, "Per token"), which runs *after* the verify whose
decision may need it, or in a later step. :class:`ObservationRing` is where the extends leave
their per-row values until the SpecExit runner reads them: one small ring per request-pool slot,
indexed by the token position the value belongs to (``key``), with the key stored beside it so a
stale entry (another position with the same ``key % capacity``, or nothing written yet) reads as
missing (NaN) instead of as a wrong value.

Writes come in the order the extends run; a later write to a key replaces an earlier one (the
extend of the step that verified a position is the last one to write the value of the position
two after it). Reads and writes are batched tensor ops without host synchronisation.

Imports: torch and stdlib only (no sglang).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union

import torch

NO_KEY = -1
"""Key of an entry nothing was written to (positions are >= 0)."""

DEFAULT_CAPACITY = 256
"""Entries per slot: more than a request's rows in one extend (``speculative_num_draft_tokens``, or a
draft-off catch-up of at most 64 deferred rows plus one) plus the unread backlog (< the rows of one
verify), with room so that a later write never lands on an entry still to be read."""


@dataclass
class ObservationRing:
    """Ring buffers of observed values, one per request slot.

    Attributes
    ----------
    values : torch.Tensor
        ``[max_slots, capacity]`` float32 values.
    keys : torch.Tensor
        ``[max_slots, capacity]`` int64 position each value belongs to, ``NO_KEY`` when empty.

    Examples
    --------
    >>> ring = ObservationRing.allocate(max_slots=2, capacity=4)
    >>> ring.write(torch.tensor([1, 1, 0]), torch.tensor([5, 6, 2]), torch.tensor([0.5, 0.25, 0.75]))
    >>> values, held = ring.read(torch.tensor([1, 0]), torch.tensor([[5, 6, 2], [2, 6, 7]]))
    >>> values.tolist(), held.tolist()
    ([[0.5, 0.25, nan], [0.75, nan, nan]], [[True, True, False], [True, False, False]])
    >>> ring.write(torch.tensor([1]), torch.tensor([9]), torch.tensor([1.0]))  # 9 % 4 == 5 % 4
    >>> ring.read(torch.tensor([1]), torch.tensor([[5, 9]]))[0].tolist()
    [[nan, 1.0]]
    """

    values: torch.Tensor  # [max_slots, capacity]
    keys: torch.Tensor  # [max_slots, capacity]

    @classmethod
    def allocate(cls, max_slots: int, capacity: int = DEFAULT_CAPACITY,
                 device: Union[str, torch.device] = "cpu") -> "ObservationRing":
        """An empty ring of ``capacity`` entries for each of ``max_slots`` slots."""
        if capacity < 1 or max_slots < 1:
            raise ValueError(f"need max_slots >= 1 and capacity >= 1, got {max_slots}, {capacity}")
        device = torch.device(device)
        return cls(values=torch.full((max_slots, capacity), float("nan"), dtype=torch.float32, device=device),
                   keys=torch.full((max_slots, capacity), NO_KEY, dtype=torch.int64, device=device))

    @property
    def capacity(self) -> int:
        return int(self.values.shape[1])

    def clear(self, slots: torch.Tensor) -> None:  # [n]
        """Forget everything of ``slots`` (a new request took them)."""
        index = slots.to(device=self.keys.device, dtype=torch.int64)
        self.keys[index] = NO_KEY
        self.values[index] = float("nan")

    def write(
        self,
        slots: torch.Tensor,  # [rows] slot of each row
        keys: torch.Tensor,  # [rows] position each value belongs to (>= 0)
        values: torch.Tensor,  # [rows]
    ) -> None:
        """Store ``values[i]`` as the value of position ``keys[i]`` of slot ``slots[i]``.

        Within one call the keys of a slot must be distinct modulo the capacity (one extend
        writes consecutive positions, fewer than the capacity).
        """
        device = self.keys.device
        slot = slots.to(device=device, dtype=torch.int64)
        key = keys.to(device=device, dtype=torch.int64)
        column = key.remainder(self.capacity)
        self.values[slot, column] = values.to(device=device, dtype=self.values.dtype)
        self.keys[slot, column] = key

    def read(
        self,
        slots: torch.Tensor,  # [batch_size]
        keys: torch.Tensor,  # [batch_size, width] positions to read (any value; < 0 reads NaN)
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # ([batch_size, width] float32, [batch_size, width] bool)
        """The values of positions ``keys[b, :]`` of slot ``slots[b]`` (NaN where not held) and
        whether each is held (a value written as NaN on purpose is held)."""
        device = self.keys.device
        slot = slots.to(device=device, dtype=torch.int64)[:, None].expand_as(keys)
        key = keys.to(device=device, dtype=torch.int64)
        column = key.remainder(self.capacity)
        held = self.keys[slot, column] == key
        held &= key >= 0
        stored = self.values[slot, column]
        return torch.where(held, stored, torch.full_like(stored, float("nan"))), held
