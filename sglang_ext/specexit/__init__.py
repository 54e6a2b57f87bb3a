"""SpecExit: early exit of the thinking phase from signals of the EAGLE3 draft (pure torch).

Modules (none imports sglang; ``defaults`` imports only the standard library):

* ``defaults``: every server-level default, defined once.
* ``signals``: method grammar, checkpoint row selection, decoding, per-step means.
* ``smoothing``: batched per-slot smoothers (ewma, momentum, mean, paragraph_mean).
* ``criterion``: the per-step exit decision (boundaries, thresholds, guards).
* ``overrides``: per-request options parsed from ``custom_params`` and merged with defaults.
* ``draft_confidence``: the training-free ``draft-confidence`` signal source.
* ``state``: ``SpecExitState``, the slot-indexed state the engine drives once per verify step.

Nothing is imported here, so ``import sglang_ext.specexit.defaults`` stays cheap.
"""
