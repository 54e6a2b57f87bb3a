"""SpecExit glue: early exit of the thinking phase inside SGLang's EAGLE worker (imports SGLang).

The maths is in the pure package :mod:`sglang_ext.specexit`; this room wires it into SGLang:

* ``runner``: :class:`~sglang_ext.engine.specexit.runner.SpecExitRunner` (per-request options and
  state at prefill, the exit decision and signals after every verify);
* ``cut``: the in-place edits of SGLang's verify result that end thinking at the exit point;
* ``report``: per-request reports, server counters and the exit log line;
* ``hooks``: ``HookRegistry`` hooks (``custom_params`` check, ``meta_info``, ``/server_info``, the
  draft class);
* ``draft_models``: the EAGLE3 draft class whose ``fc`` carries the SpecExit signal rows;
* ``checkpoint``: writes a SpecExit draft checkpoint (stock EAGLE3 rows plus signal rows);
* ``frontend``: SpecExit options for SGLang frontend programs (``sgl.function``).

See ``docs/architecture.md#one-decode-step`` for how a step flows through these modules.
"""
