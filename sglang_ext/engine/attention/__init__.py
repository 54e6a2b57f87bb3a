"""Attention backends registered with SGLang by the plugin.

* ``torch_sdpa``: a torch SDPA tree-attention backend (EXTEND, DECODE, tree and ragged
  TARGET_VERIFY, DRAFT_EXTEND_V2, multi-step draft); the CPU testbed's default and the GPU oracle;
* ``torch_sdpa_plan``: its attention plans (pure torch: groups, key slots, masks, buckets, ``run_plan``);
* ``torch_sdpa_modes``: the plan of each forward mode and the multi-step draft round (pure torch);
* ``registry``: registers a backend's name, CLI choice and AROUND hooks with SGLang (both backends);
* ``flashinfer_dcut``: SGLang's FlashInfer backend plus ragged (pruned) verification and one
  CUDA graph per tier (GPU);
* ``flashinfer_verify_plan``: its planning maths (pure torch, tested on CPU): ragged layout, packed
  mask, per-tier graph shapes, the paged-attention reference.
"""
