"""EAGLE3 draft model class for SGLang whose ``fc`` carries SpecExit signal rows.

A SpecExit checkpoint (AngelSlim layout, EAGLE3 trainers' format, and the testbed draft in
``sglang_ext/testbed/models/draft``) stores ``fc.weight`` of shape
``[H + k, num_aux * H_target]``: rows ``0..H-1`` are the ordinary EAGLE3 input
projection, rows ``H..H+k-1`` the raw SpecExit signals (order confidence,
progress, remain, restricted to the trained method).  SGLang's own
``LlamaForCausalLMEagle3`` builds ``fc`` with ``H`` rows and rejects such a
checkpoint.  :class:`LlamaForCausalLMEagle3SpecExit` subclasses it, keeps the
first ``H`` rows in the parent's ``fc`` (so drafting is exactly the parent's) and
the rest in the buffer ``specexit_fc`` ``# [k, num_aux * H_target]``; ``k`` is
inferred from the checkpoint at load time (``specexit_k``; 0 for a plain EAGLE3
checkpoint).

Selection: such checkpoints are saved under SGLang's standard name ``LlamaForCausalLMEagle3``;
the ``get_model_architecture`` hook (``hooks._around_get_model_architecture``) reads the ``fc``
shape from the weight headers (``checkpoint.inspect_draft``) and hands SGLang this class when
``fc`` has extra rows.  :func:`register_draft_models` also registers it under the former name
``LlamaForCausalLMEagle3SpecExit`` (:data:`ARCHITECTURE`), which older checkpoints record.  The
module defines ``EntryClass`` so that ``SGLANG_EXTERNAL_MODEL_PACKAGE`` can point at a package
containing it.

Launch check: after the weights are loaded, with ``--specexit --specexit-signal-source head``
:func:`sglang_ext.engine.specexit.checkpoint.head_rows` checks the head against
``--specexit-method`` (one line naming the flag when it cannot serve it).
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch
import torch.nn.functional as F

from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

from sglang_ext.engine.specexit.checkpoint import HEAD_SIGNAL_SOURCE, LEGACY_SPECEXIT_ARCHITECTURE, head_rows

#: Registry name of the class (the former ``architectures`` entry of the project's SpecExit drafts).
ARCHITECTURE = LEGACY_SPECEXIT_ARCHITECTURE


def _is_fc_weight(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] == "fc"


class LlamaForCausalLMEagle3SpecExit(LlamaForCausalLMEagle3):
    """``LlamaForCausalLMEagle3`` that accepts ``fc`` of shape ``[H + k, 3H]``.

    Attributes
    ----------
    specexit_k : int
        Number of signal rows found in the checkpoint (0 when none).
    specexit_fc : torch.Tensor
        ``# [specexit_k, num_aux * target_hidden_size]`` the signal rows.
    specexit_method : str or None
        ``config.specexit_method`` when the checkpoint records it.
    """

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        fc = self.model.fc
        k0 = int(getattr(config, "specexit_num_signals", 0) or 0)
        self.register_buffer(
            "specexit_fc",
            torch.zeros(k0, fc.in_features, dtype=fc.weight.dtype, device=fc.weight.device),
            persistent=False,
        )
        self.specexit_k = k0
        self.specexit_method: Optional[str] = getattr(config, "specexit_method", None)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        hidden = self.model.fc.out_features

        def split_fc():
            for name, w in weights:
                if _is_fc_weight(name) and w.dim() == 2 and w.shape[0] > hidden:
                    self._set_signal_rows(w[hidden:])
                    w = w[:hidden]
                elif _is_fc_weight(name) and w.dim() == 2 and w.shape[0] == hidden:
                    self._set_signal_rows(w[:0])
                yield name, w

        super().load_weights(split_fc())
        self._check_against_server()

    def _check_against_server(self) -> None:
        """With ``--specexit --specexit-signal-source head``, :func:`head_rows` on the loaded head
        (raises its one-line error); nothing outside a scheduler or with SpecExit off."""
        try:
            from sglang.srt.runtime_context import get_server_args

            from sglang_ext.config import get_extension_config

            cfg = get_extension_config(get_server_args()).specexit
        except Exception:  # no runtime context (a unit test building the class by hand)
            return
        if cfg.enabled and cfg.signal_source == HEAD_SIGNAL_SOURCE:
            head_rows(self.specexit_k, self.specexit_method, cfg.method,
                      where=f"the draft ({getattr(self.config, '_name_or_path', '') or 'speculative draft model'})")

    def _set_signal_rows(self, rows: torch.Tensor) -> None:
        ref = self.model.fc.weight
        if rows.shape[1] != ref.shape[1]:
            raise ValueError(
                f"SpecExit rows of fc have {rows.shape[1]} input features, fc expects {ref.shape[1]}"
            )
        self.specexit_fc = rows.detach().to(device=ref.device, dtype=ref.dtype).contiguous()
        self.specexit_k = int(rows.shape[0])

    def specexit_logits(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Raw signals ``z`` of target features.

        Parameters
        ----------
        target_hidden : torch.Tensor
            ``# [num_tokens, num_aux * target_hidden_size]`` the concatenated
            EAGLE3 target features (what ``fc`` receives).

        Returns
        -------
        torch.Tensor
            ``# [num_tokens, specexit_k]``; decode with sigmoid (confidence,
            progress) or exp (remain).
        """
        x = target_hidden
        if self.model.input_norm is not None:
            x = self.model.input_norm(x)
        if self.model.fc_norm is not None:
            chunks = x.chunk(self.model.num_aux_hidden_states, dim=-1)
            x = torch.cat([n(c) for n, c in zip(self.model.fc_norm, chunks)], dim=-1)
        return F.linear(x.to(self.specexit_fc.dtype), self.specexit_fc)


EntryClass = [LlamaForCausalLMEagle3SpecExit]


def register_draft_models() -> None:
    """Add :class:`LlamaForCausalLMEagle3SpecExit` to SGLang's ``ModelRegistry`` under :data:`ARCHITECTURE`
    (idempotent)."""
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models[ARCHITECTURE] = LlamaForCausalLMEagle3SpecExit
