"""D-Cut glue: batch-level draft pruning inside SGLang's speculative workers (imports SGLang).

The maths is in the pure package :mod:`sglang_ext.dcut`; this room wires it into SGLang:

* ``runner``: :class:`~sglang_ext.engine.dcut.runner.DCutRunner`, the D-Cut step of the EAGLE
  worker's ``verify()`` (plan, TP agreement, calibration, online costs, draft-off);
* ``compact_verify``: the kept rows of a pruned step (``CompactVerify``) and the one swap of the
  target forward that runs over them (``TargetForwardInterceptor``), shared with DFlash;
* ``metrics``: what a step did (``StepDecision``), the running totals and step clock
  (``DCutMetrics``), the opt-in per-step time split (``StepTiming``);
* ``dflash``: D-Cut on DFlash blocks (``DFlashDCutRunner``, confidences, candidate poisoning);
* ``profiler``: the launch-time cost table (file, cache or profile) and its publication;
* ``graphs``: one target-verify CUDA graph per (batch size, tier) (GPU);
* ``draft_extend``: the eager draft extend over the accepted rows only;
* ``deferred_extend``: the draft extend of draft-off steps, deferred and caught up in one extend
  before drafting resumes;
* ``depth_mode``: ``--dcut auto`` under ``--speculative-adaptive``: the chain depth chosen among
  SGLang's adaptive runtime states (``DCutDepthPolicy`` drives SGLang's ``AdaptiveController``);
* ``hooks``: ``HookRegistry`` hooks (tree path scores, ``/server_info``, ``/set_internal_state``);
* ``client``: read and switch the D-Cut state of a running server (tests, benches).

See ``docs/architecture.md#one-decode-step`` for how a step flows through these modules.
"""
