"""SpecExit drafts in the EAGLE3 trainers' format (standard architecture name, extra ``fc`` rows, no
extension field in ``config.json``).

In-process, through SGLang's real ``get_model_architecture`` with the plugin's hook (tiny random
checkpoints written here, a few KB each; the server's flags come from a published ``ServerArgs``
stand-in with the extension config attached):

* the signal rows are read from the safetensors header (single file, sharded with an index, ``.bin``);
* a trainer-format draft with 1..3 extra rows gets the SpecExit class under the unchanged name
  ``LlamaForCausalLMEagle3``, a plain draft keeps SGLang's class, the former name still resolves;
* with ``--specexit --specexit-signal-source head`` the launch check: a plain draft is refused with a
  line suggesting ``draft-confidence``; a recorded method whose size differs from the rows, a 1- or
  2-row head with no recorded method, or a method the head lacks, with a line naming
  ``--specexit-method``; the accepted combinations give the expected head rows.

Real engine (trained testbed models): a trainer-format copy of the committed draft (same weights,
``config.json`` without the extension fields) loads with ``--specexit`` and gives the committed
draft's outputs and exits token for token; slow tier: a real launch with a 1-row head and no recorded
method stops naming ``--specexit-method``.

Budget: in-process < 20 s; engine part ~2-3 min (two engine start-ups); slow tier + ~1 min.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch

from sglang_ext.config import ConfigError, ExtensionConfig, SpecExitConfig, attach_extension_config

H, NUM_AUX = 16, 3
BASE_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
    "target_hidden_size": H, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 32, "draft_vocab_size": 32,
    "tie_word_embeddings": False, "torch_dtype": "float32",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True},
}


def write_trainer_draft(path, k: int, method=None, arch="LlamaForCausalLMEagle3", layout="single"):
    """A random draft as EAGLE3 trainers save it: ``fc.weight`` [H + k, 3H], ``config.json`` without
    extension fields (``specexit_method`` only when ``method`` is given)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(k)
    state = {
        "fc.weight": torch.randn(H + k, NUM_AUX * H, generator=gen),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "lm_head.weight": torch.randn(32, H, generator=gen),
        "d2t": torch.zeros(32, dtype=torch.int64),
    }
    config = dict(BASE_CONFIG, architectures=[arch])
    if method is not None:
        config["specexit_method"] = method
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    if layout == "single":
        save_file(state, os.path.join(path, "model.safetensors"))
    elif layout == "sharded":
        names = sorted(state)
        shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
        for shard, keys in shards.items():
            save_file({n: state[n] for n in keys}, os.path.join(path, shard))
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {n: s for s, keys in shards.items() for n in keys}}, f)
    else:
        torch.save(state, os.path.join(path, "pytorch_model.bin"))
    return str(path)


# ----------------------------------------------------------------------------- header reading
@pytest.mark.parametrize("layout", ["single", "sharded", "bin"])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_signal_rows_read_from_the_weight_headers(tmp_path, k, layout):
    from sglang_ext.engine.specexit.checkpoint import inspect_draft

    head = inspect_draft(write_trainer_draft(tmp_path / "d", k, layout=layout))
    assert head.known and head.fc_rows == H + k and head.num_signals == k
    assert head.architecture == "LlamaForCausalLMEagle3" and head.recorded_method is None


# ----------------------------------------------------------------------------- class selection (real hook)
@pytest.fixture(scope="module")
def resolve():
    """SGLang's ``get_model_architecture`` (with the plugin's hook) on a draft directory."""
    import sglang_ext

    sglang_ext.load()
    from sglang.srt.model_loader import utils as loader_utils
    from sglang.srt.configs.model_config import ModelImpl
    from transformers import AutoConfig

    def run(path):
        mc = SimpleNamespace(hf_config=AutoConfig.from_pretrained(path), model_path=path, is_draft_model=True,
                             quantization=None, model_impl=ModelImpl.AUTO, is_embedding_gemma=False)
        return loader_utils.get_model_architecture(mc)

    return run


@pytest.fixture
def server(monkeypatch):
    """Publish a server whose extension config is set by the test (``server(specexit=...)``)."""
    import sglang.srt.runtime_context as rc

    def set_flags(**specexit):
        sa = SimpleNamespace()
        attach_extension_config(sa, ExtensionConfig(specexit=SpecExitConfig(**specexit)))
        monkeypatch.setattr(rc, "get_server_args", lambda: sa)

    set_flags()
    return set_flags


@pytest.mark.parametrize("k", [1, 2, 3])
def test_trainer_format_draft_gets_the_specexit_class(resolve, server, tmp_path, k):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    from sglang_ext.engine.specexit.draft_models import LlamaForCausalLMEagle3SpecExit

    method = {1: "confidence", 2: "confidence_remain", 3: None}[k]
    cls, arch = resolve(write_trainer_draft(tmp_path / "d", k, method=method))
    assert cls is LlamaForCausalLMEagle3SpecExit and issubclass(cls, LlamaForCausalLMEagle3)
    assert arch == "LlamaForCausalLMEagle3"  # the name SGLang's other checks compare against


def test_plain_draft_keeps_sglang_class_and_former_name_still_loads(resolve, server, tmp_path):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    from sglang_ext.engine.specexit.draft_models import LlamaForCausalLMEagle3SpecExit

    assert resolve(write_trainer_draft(tmp_path / "plain", 0)) == (LlamaForCausalLMEagle3, "LlamaForCausalLMEagle3")
    legacy = write_trainer_draft(tmp_path / "legacy", 3, arch="LlamaForCausalLMEagle3SpecExit")
    assert resolve(legacy) == (LlamaForCausalLMEagle3SpecExit, "LlamaForCausalLMEagle3SpecExit")


# ----------------------------------------------------------------------------- launch check
REFUSED = [
    # (rows, recorded method, --specexit-method, flag named, words of the message)
    (0, None, "confidence_progress_remain", "--specexit-signal-source head", "draft-confidence"),
    (1, None, "confidence", "--specexit-method", "records no specexit_method"),
    (2, None, "confidence_progress", "--specexit-method", "records no specexit_method"),
    (2, "confidence", "confidence", "--specexit-method", "but its fc has 2 SpecExit signal rows"),
    (1, "confidence_progress", "confidence", "--specexit-method", "but its fc has 1 SpecExit signal row"),
    (1, "progress", "confidence", "--specexit-method", "lacks"),
    (2, "confidence_remain", "progress", "--specexit-method", "lacks"),
    (3, None, "confidence_progress_remain", None, None),  # control: accepted
]


@pytest.mark.parametrize("rows,recorded,method,flag,words", REFUSED)
def test_head_is_checked_against_the_flags_before_loading(resolve, server, tmp_path, rows, recorded, method,
                                                          flag, words):
    path = write_trainer_draft(tmp_path / "d", rows, method=recorded)
    server(enabled=False, method=method)
    resolve(path)  # SpecExit off: any head loads
    server(enabled=True, method=method, signal_source="draft-confidence" if method == "confidence" else "head")
    if method == "confidence":
        resolve(path)  # draft-confidence ignores the head
    server(enabled=True, method=method)
    if flag is None:
        resolve(path)
        return
    with pytest.raises(ConfigError) as e:
        resolve(path)
    msg = str(e.value)
    assert msg.startswith(flag) and words in msg and "\n" not in msg, msg
    assert path in msg


@pytest.mark.parametrize("rows,recorded,method,expected", [
    (3, None, "confidence_progress_remain", (0, 1, 2)),
    (3, None, "remain_confidence", (0, 2)),  # 3 unrecorded rows: canonical order, any subset (order-insensitive)
    (3, "remain_progress_confidence", "progress", (1,)),  # a recorded method is read in canonical order
    (1, "progress", "progress", (0,)),
    (2, "confidence_remain", "remain", (1,)),
])
def test_accepted_heads_map_the_method_to_rows(rows, recorded, method, expected):
    from sglang_ext.engine.specexit.checkpoint import head_rows

    assert head_rows(rows, recorded, method) == expected


# ----------------------------------------------------------------------------- real engine, trained models
MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "sglang_ext", "testbed", "models")
TRAINED = os.path.isfile(os.path.join(MODELS, "draft", "model.safetensors"))


def _trainer_copy(dst: str) -> str:
    """The committed draft as a trainer saves it: same weight file, config.json without extension fields."""
    src = os.path.join(MODELS, "draft")
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    for field in [k for k in config if k.startswith("specexit_")]:
        del config[field]
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


def _run(draft: str, prompts, max_new: int):
    from engine_utils import make_engine

    eng = make_engine(os.path.join(MODELS, "target"), attention_backend="torch_sdpa",
                      speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                      speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                      max_total_tokens=16384, max_running_requests=16, specexit=True,
                      specexit_smoothing="paragraph_mean", specexit_progress_threshold=0.2)
    try:
        outs = eng.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": max_new})
    finally:
        eng.shutdown()
    keys = ("specexit_active", "specexit_exited", "specexit_exit_reason", "specexit_think_tokens")
    return [(o["output_ids"], tuple(o["meta_info"].get(k) for k in keys)) for o in outs]


@pytest.mark.skipif(not TRAINED, reason="trained testbed models not present")
def test_trainer_format_copy_of_the_committed_draft_gives_the_same_outputs(tmp_path):
    import sys

    from transformers import AutoTokenizer

    from sglang_ext.engine.specexit.checkpoint import inspect_draft
    from sglang_ext.testbed import task

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    from specexit_eval import held_out_problems

    copy = _trainer_copy(str(tmp_path / "draft"))
    with open(os.path.join(copy, "model.safetensors"), "rb") as a, \
            open(os.path.join(MODELS, "draft", "model.safetensors"), "rb") as b:
        assert a.read() == b.read()
    assert inspect_draft(copy).num_signals == 3 and inspect_draft(copy).recorded_method is None
    tok = AutoTokenizer.from_pretrained(os.path.join(MODELS, "target"))
    prompts = [tok.encode(task.prompt_text(p["question"], True), add_special_tokens=False)
               for p in held_out_problems(8, 2026)]
    committed = _run(os.path.join(MODELS, "draft"), prompts, 160)
    trainer = _run(copy, prompts, 160)
    assert trainer == committed
    assert any(meta[1] for _, meta in committed), "no SpecExit exit: the comparison would not cover the head"


@pytest.mark.slow
def test_launch_with_an_unrecorded_one_row_head_fails_naming_the_flag(tiny_models, tmp_path):
    """A real ``python -m sglang.launch_server``: a 1-row head with no recorded method stops the launch."""
    from safetensors.torch import load_file, save_file

    from sglang_ext import demo
    from sglang_ext.engine.cpu.standins import cpu_testbed_env

    draft = str(tmp_path / "draft")
    shutil.copytree(tiny_models.draft, draft)
    weights = os.path.join(draft, "model.safetensors")
    state = load_file(weights)
    (fc,) = [k for k in state if k.endswith("fc.weight")]
    state[fc] = torch.cat([state[fc], torch.zeros(1, state[fc].shape[1])])
    save_file(state, weights)
    models = demo.DemoModels(tiny_models.target, draft, trained=False)
    # the demo's flags, then the head source and the method this head cannot be checked against
    cmd = demo.server_command(models, demo.free_port(), ["--specexit-signal-source", "head",
                                                          "--specexit-method", "confidence", "--dcut", "off"])
    proc = subprocess.run(cmd, env=cpu_testbed_env(), capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "--specexit-method: the draft" in out and "records no specexit_method" in out, out[-3000:]
