"""GGUF checkpoint -> Hugging Face safetensors directory (fp32), loadable by SGLang.

transformers (with the ``gguf`` and ``accelerate`` packages) reads a GGUF file and
dequantizes it into a ``*ForCausalLM``; such a model refuses ``save_pretrained``, so the
converter builds a fresh model from the same config on the meta device and assigns the
state dict's tensors into it (no second copy of the weights: the 1.5B Qwen2 model stays
under 10 GB peak), then saves that.  The tokenizer comes from the GGUF metadata too; the chat template is
the GGUF's own, else ``fallback_chat_template``.

Runs with ``HF_HUB_OFFLINE=1``: nothing is fetched from a model hub.  No SGLang import.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from sglang_ext.envutil import environ

#: Architectures the converted directory may declare (Llama- and Qwen2-family checkpoints).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
#: GGUF ``model_type`` -> architecture, for configs that name none.
ARCHITECTURE_OF_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


class ConversionError(Exception):
    """The GGUF file cannot be converted (one-line message)."""


@contextmanager
def hub_offline() -> Iterator[None]:
    """Set ``HF_HUB_OFFLINE=1`` (and transformers' twin) for the block."""
    with environ({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}):
        yield


def convert_gguf(gguf_path: str, out_dir: str, fallback_chat_template: Optional[str] = None,
                 progress: bool = True, log=print) -> dict:
    """Write ``out_dir`` (config.json, model.safetensors, tokenizer files, chat template).

    ``out_dir`` must not exist yet (the caller renames a temporary directory into place).
    Returns a small record (architecture, parameter count, seconds).
    """
    import torch

    t0 = time.perf_counter()
    if os.path.exists(out_dir):
        raise ConversionError(f"conversion output {out_dir} already exists")
    src_dir, fname = os.path.split(os.path.abspath(gguf_path))
    with hub_offline():
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        if not progress:
            hf_logging.disable_progress_bar()
        try:
            config = AutoConfig.from_pretrained(src_dir, gguf_file=fname)
        except Exception as e:  # transformers raises several types for unsupported files
            raise ConversionError(f"cannot read the GGUF config of {fname}: {_one_line(e)}") from None
        arch = (getattr(config, "architectures", None) or [None])[0]
        if arch is None:
            arch = ARCHITECTURE_OF_TYPE.get(config.model_type)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConversionError(f"{fname}: architecture {arch or config.model_type!r} is not "
                                  f"supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        log(f"[convert] dequantizing {fname} ({config.num_hidden_layers} layers, hidden "
            f"{config.hidden_size}, vocab {config.vocab_size}) to float32")
        loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32)
        state = loaded.state_dict()
        del loaded
        config.architectures = [arch]
        config.dtype = "float32"
        for k in ("_name_or_path", "_model_name_or_path"):
            if hasattr(config, k):
                try:
                    delattr(config, k)
                except AttributeError:
                    pass
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        # Tied embeddings: lm_head.weight may be absent from (or extra in) the state dict.
        tied = bool(getattr(config, "tie_word_embeddings", False))
        missing = [k for k in missing if not (tied and k == "lm_head.weight")]
        unexpected = [k for k in unexpected if not (tied and k == "lm_head.weight")]
        if missing or unexpected:
            raise ConversionError(f"{fname}: state dict does not match {arch} "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        if tied:
            model.tie_weights()
        left = [n for n, prm in model.named_parameters() if prm.is_meta]
        if left:
            raise ConversionError(f"{fname}: no weights for {left[:3]} in the GGUF state dict")
        log(f"[convert] writing safetensors to {out_dir}")
        model.save_pretrained(out_dir, safe_serialization=True)
        n_params = sum(p.numel() for p in model.parameters())
        del model, state
        tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
        if not getattr(tok, "chat_template", None):
            if fallback_chat_template is None:
                raise ConversionError(f"{fname} has no chat template and the registry gives none")
            tok.chat_template = fallback_chat_template
        tok.save_pretrained(out_dir)
    _write_generation_config(out_dir, config)
    return {"architecture": arch, "num_parameters": n_params,
            "seconds": round(time.perf_counter() - t0, 2)}


def _write_generation_config(out_dir: str, config) -> None:
    """Greedy-neutral generation config naming the model's end-of-sequence id."""
    path = os.path.join(out_dir, "generation_config.json")
    gen = {}
    if os.path.exists(path):
        with open(path) as f:
            gen = json.load(f)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(config, k, None)
        if v is not None:
            gen.setdefault(k, v)
    with open(path, "w") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:300]}"


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
