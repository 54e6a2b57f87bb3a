"""The project's ``EAGLEWorkerV2`` subclass (selected by the plugin when --specexit or --dcut is on).

``verify()`` is the seam for both features (see ``SGLANG_MAP.md`` section 2 and
``VERIFY_EDIT_MAP.md``): D-Cut prunes the verify input before the target forward, SpecExit edits
the ``GenerationBatchResult`` after it, and both run before lengths are published.
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_ext.engine.plugin import get_extension_config

logger = logging.getLogger(__name__)


class ExtEAGLEWorker(EAGLEWorkerV2):
    """EAGLE/EAGLE3 worker with the sglang_ext configs attached (``self.ext_config``)."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port, target_worker=target_worker)
        self.ext_config = get_extension_config(server_args)
        logger.info("sglang_ext worker active: specexit=%s dcut=%s", self.ext_config.specexit.enabled,
                    self.ext_config.dcut.mode)
