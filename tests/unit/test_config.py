"""Extension config dataclasses: parsing, validation messages, cross-checks, token resolution.

Budget: < 5 s. No sglang import.
"""

import dataclasses
import json

import pytest

from sglang_ext.config import (
    ConfigError,
    DCutConfig,
    SpecExitConfig,
    check_against_server,
    configs_from_mapping,
    iter_flags,
    preset_values,
    resolve_token_ids,
)


def test_no_sglang_import():
    import ast
    import inspect

    import sglang_ext.config as cfg

    tree = ast.parse(inspect.getsource(cfg))
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in mods if m and m.split(".")[0] == "sglang"]


def test_defaults_match_the_reference_values():
    se, dc = SpecExitConfig(), DCutConfig()
    assert (se.enabled, se.method, se.smoothing, se.ewma_alpha, se.window) == (
        False, "confidence_progress_remain", "ewma", 0.1, 10)
    assert (se.confidence_threshold, se.progress_threshold, se.remain_threshold) == (0.8, 0.3, 200.0)
    assert (se.min_think_tokens, se.max_think_tokens, se.max_think_grace) == (0, None, 64)
    assert se.stop_think_token == "</think>" and se.signal_source == "head"
    assert se.step_split_tokens == ("\n\n", "\n\n\n", ".\n\n", ".\n\n\n", " \n\n", " \n\n\n")
    assert (dc.mode, dc.tiers, dc.cost_table, dc.profile_steps, dc.profile_warmup) == (
        "off", (0.25, 0.5, 0.75, 1.0), None, 5, 3)
    assert not dc.enabled and dc.fixed_ratio is None


def test_flag_table_covers_every_field_once():
    for cls in (SpecExitConfig, DCutConfig):
        names = [n for n, _, _ in iter_flags(cls)]
        assert names == [f.name for f in dataclasses.fields(cls) if f.init]  # not the derived SpecExit 'explicit'
    flags = [s.flag for c in (SpecExitConfig, DCutConfig) for _, s, _ in iter_flags(c)]
    assert len(flags) == len(set(flags))
    assert all(f.startswith("--specexit") or f.startswith("--dcut") for f in flags)


def test_mapping_parses_strings_and_typed_values():
    cfg = configs_from_mapping({"specexit": "true", "specexit_method": "remain_progress", "specexit_window": "4",
                                "specexit_max_think_tokens": "off", "specexit_step_split_tokens": '["\\n\\n"]',
                                "dcut": "0.5", "dcut_profile_batch_sizes": "1,8,16"})
    assert cfg.specexit.enabled and cfg.specexit.method == "progress_remain" and cfg.specexit.window == 4
    assert cfg.specexit.max_think_tokens is None and cfg.specexit.step_split_tokens == ("\n\n",)
    assert cfg.dcut.fixed_ratio == 0.5 and cfg.dcut.profile_batch_sizes == (1, 8, 16)
    typed = configs_from_mapping({"specexit": True, "specexit_ewma_alpha": 0.5, "dcut": "auto",
                                  "dcut_tiers": [0.5, 1.0]})
    assert typed.specexit.ewma_alpha == 0.5 and typed.dcut.auto and typed.dcut.tiers == (0.5, 1.0)
    assert typed.specexit.signals == ("confidence", "progress", "remain")


@pytest.mark.parametrize("values,flag", [
    ({"specexit_ewma_alpha": "abc"}, "--specexit-ewma-alpha"),
    ({"specexit_window": "2.5"}, "--specexit-window"),
    ({"specexit_window": "300"}, "--specexit-window"),
    ({"specexit_smoothing": "median"}, "--specexit-smoothing"),
    ({"specexit_method": "confidence_confidence"}, "--specexit-method"),
    ({"specexit_min_think_tokens": "10", "specexit_max_think_tokens": "5"}, "--specexit-max-think-tokens"),
    ({"specexit_stop_think_token": ""}, "--specexit-stop-think-token"),
    ({"specexit_step_split_tokens": "[1, 2]"}, "--specexit-step-split-tokens"),
    ({"dcut": True}, "--dcut"),
    ({"dcut": "nan"}, "--dcut"),
    ({"dcut_tiers": "1.0,1.0"}, "--dcut-tiers"),
    ({"dcut_tiers": ""}, "--dcut-tiers"),
    ({"dcut_profile_steps": "x"}, "--dcut-profile-steps"),
    ({"dcut_online_costs": "sometimes"}, "--dcut-online-costs"),
])
def test_errors_name_the_flag(values, flag):
    with pytest.raises(ConfigError) as e:
        configs_from_mapping(values)
    assert str(e.value).startswith(flag + ":")
    assert "\n" not in str(e.value)


def test_unset_method_follows_the_signal_source():
    assert SpecExitConfig(signal_source="draft-confidence").method == "confidence"
    assert SpecExitConfig(signal_source="head").method == "confidence_progress_remain"
    assert configs_from_mapping({"specexit": True, "specexit_signal_source": "draft-confidence"}
                                ).specexit.method == "confidence"
    assert SpecExitConfig(signal_source="draft-confidence", method="confidence").explicit == ("method",)
    assert SpecExitConfig(signal_source="draft-confidence").explicit == ()


@pytest.mark.parametrize("method", ["confidence_progress_remain", "remain", "confidence_progress"])
def test_explicit_method_incompatible_with_draft_confidence_is_refused(method):
    with pytest.raises(ConfigError) as e:
        configs_from_mapping({"specexit": True, "specexit_signal_source": "draft-confidence",
                              "specexit_method": method})
    assert str(e.value).startswith("--specexit-signal-source: signal source 'draft-confidence' provides "
                                   "confidence only"), str(e.value)
    assert "--specexit-method" in str(e.value) and "\n" not in str(e.value)


def test_multi_token_stop_think_string_makes_specexit_inactive_unless_given():
    from sglang_ext.config import NO_STOP_THINK_ID, resolve_token_ids

    vocab = {"\n\n": 3, "</reflect>": 9}
    encode = lambda s: [vocab[s]] if s in vocab else [5, 6, 7]  # noqa: E731 ('</think>': 3 tokens)
    r = resolve_token_ids(SpecExitConfig(enabled=True), encode)
    assert not r.active and r.stop_think_id == NO_STOP_THINK_ID and r.step_split_ids == ()
    assert r.inactive_reason.startswith("the tokenizer has no single '</think>' token (it encodes to 3 tokens)")
    with pytest.raises(ConfigError, match=r"^--specexit-stop-think-token: '</think>' must encode to exactly one"):
        resolve_token_ids(SpecExitConfig(enabled=True, stop_think_token="</think>"), encode)  # given: an error
    ok = resolve_token_ids(SpecExitConfig(enabled=True, stop_think_token="</reflect>"), encode)
    assert ok.active and (ok.stop_think_id, ok.step_split_ids) == (9, (3,))


def test_default_boundaries_without_a_single_token_make_specexit_inactive_unless_given():
    from sglang_ext.config import resolve_token_ids

    encode = lambda s: [4] if s == "</think>" else [1, 2]  # noqa: E731 (no boundary string is one token)
    r = resolve_token_ids(SpecExitConfig(enabled=True), encode)
    assert not r.active and "--specexit-step-split-tokens" in r.inactive_reason
    with pytest.raises(ConfigError, match=r"^--specexit-step-split-tokens: none of"):
        resolve_token_ids(SpecExitConfig(enabled=True, step_split_tokens=("\n\n",)), encode)


def test_cross_checks_with_the_speculative_algorithm():
    on = configs_from_mapping({"specexit": True, "dcut": "auto"})
    for algo in ("EAGLE3", "eagle", "NEXTN"):
        check_against_server(on, algo)
    check_against_server(configs_from_mapping({"dcut": "auto"}), "DFLASH")
    with pytest.raises(ConfigError, match=r"^--specexit: needs a draft \(--speculative-algorithm EAGLE3, EAGLE, "
                                          r"NEXTN or STANDALONE\), got DFLASH$"):
        check_against_server(configs_from_mapping({"specexit": True}), "DFLASH")
    with pytest.raises(ConfigError, match=r"^--dcut: D-Cut prunes speculative decoding"):
        check_against_server(configs_from_mapping({"dcut": "0.5"}), None)
    with pytest.raises(ConfigError, match=r"^--dcut: not supported with --speculative-algorithm NGRAM"):
        check_against_server(configs_from_mapping({"dcut": "auto"}), "NGRAM")
    # STANDALONE: D-Cut, and SpecExit with the draft's own probabilities (no signal rows to read)
    check_against_server(configs_from_mapping({"dcut": "auto"}), "standalone")
    check_against_server(configs_from_mapping({"specexit": True, "specexit_signal_source": "draft-confidence"}),
                         "STANDALONE")
    with pytest.raises(ConfigError, match=r"^--specexit-signal-source head: a STANDALONE draft is a plain language "
                                          r"model without SpecExit signal rows; add --specexit-signal-source "
                                          r"draft-confidence$"):
        check_against_server(configs_from_mapping({"specexit": True}), "STANDALONE")
    check_against_server(configs_from_mapping({}), None)  # everything off: nothing to check


@pytest.mark.parametrize("flags,flag", [({"specexit": True}, "--specexit"), ({"dcut": "auto"}, "--dcut")])
def test_prefill_decode_disaggregation_is_refused(flags, flag):
    cfg = configs_from_mapping(flags)
    for mode in ("decode", "prefill"):
        with pytest.raises(ConfigError, match=f"^{flag}: not supported with --disaggregation-mode {mode}"):
            check_against_server(cfg, "EAGLE3", mode)
    check_against_server(cfg, "EAGLE3", "null")  # SGLang's default: no disaggregation
    check_against_server(configs_from_mapping({}), "EAGLE3", "decode")  # extension off: nothing to refuse


def test_cost_table_path_must_exist(tmp_path):
    with pytest.raises(ConfigError, match=r"^--dcut-cost-table: file not found"):
        DCutConfig(mode="auto", cost_table=str(tmp_path / "missing.json"))
    p = tmp_path / "t.json"
    p.write_text(json.dumps({}))
    assert DCutConfig(mode="auto", cost_table=str(p)).cost_table == str(p)


def _encoder(vocab):
    return lambda s: [vocab[s]] if s in vocab else [90, 91]


def test_resolve_token_ids_keeps_single_token_split_strings():
    r = resolve_token_ids(SpecExitConfig(enabled=True), _encoder({"</think>": 7, "\n\n": 3, ".\n\n": 4}))
    assert r.stop_think_id == 7 and r.step_split_ids == (3, 4)
    assert set(r.dropped_step_split) == {"\n\n\n", ".\n\n\n", " \n\n", " \n\n\n"}


def test_resolve_token_ids_errors_name_the_flag():
    """Strings the user gave that are not usable are errors (unset ones make SpecExit inactive, below)."""
    with pytest.raises(ConfigError, match=r"^--specexit-stop-think-token: '</think>' must encode to exactly one"):
        resolve_token_ids(SpecExitConfig(enabled=True, stop_think_token="</think>"), _encoder({"\n\n": 3}))
    with pytest.raises(ConfigError, match=r"^--specexit-step-split-tokens: none of"):
        resolve_token_ids(SpecExitConfig(enabled=True, step_split_tokens=("\n\n",)), _encoder({"</think>": 7}))


def test_options_bridge_to_per_request_form():
    o = SpecExitConfig(enabled=True, method="progress_confidence", window=3, smoothing="mean").options()
    assert o.method.name == "confidence_progress" and o.window == 3 and o.smoothing.label == "mean"
    assert o.thresholds == (0.8, 0.3, 200.0)


def test_preset_lists_become_the_one_command_line_value():
    out = preset_values({"dcut-tiers": [0.25, 0.5, 1], "dcut-profile-batch-sizes": [1, 8],
                         "specexit-method": ["remain", "confidence"], "specexit-step-split-tokens": ["\n\n", ".\n\n"],
                         "port": 30000, "cuda-graph-bs-decode": [1, 2], "dcut": "auto"})
    assert out == {"dcut-tiers": "0.25,0.5,1", "dcut-profile-batch-sizes": "1,8",
                   "specexit-method": "remain_confidence", "specexit-step-split-tokens": '["\\n\\n", ".\\n\\n"]',
                   "port": 30000, "cuda-graph-bs-decode": [1, 2], "dcut": "auto"}
    # the joined strings parse to what the lists mean
    cfg = configs_from_mapping({k.replace("-", "_"): v for k, v in out.items() if k.startswith(("dcut", "specexit"))})
    assert cfg.dcut.tiers == (0.25, 0.5, 1.0) and cfg.dcut.profile_batch_sizes == (1, 8)
    assert cfg.specexit.method == "confidence_remain" and cfg.specexit.step_split_tokens == ("\n\n", ".\n\n")
    assert preset_values({"dcut-tiers": []}) == {"dcut-tiers": ""}  # then refused like --dcut-tiers ''


@pytest.mark.parametrize("value,expected", [(True, True), (False, False), ("on", True), ("Yes", True), (1, True),
                                            ("off", False), ("false", False), (0, False)])
def test_preset_switch_reads_boolean_words(value, expected):
    assert preset_values({"specexit": value}) == {"specexit": expected}


@pytest.mark.parametrize("values,message", [
    ({"specexit": "yes-please"}, "--specexit: expected true or false, got 'yes-please'"),
    ({"specexit": None}, "--specexit: expected true or false, got None"),
    ({"specexit": 0.5}, "--specexit: expected true or false, got 0.5"),
    ({"specexit": [True]}, "--specexit: expected true or false, got [True]"),
    ({"dcut": ["auto"]}, "--dcut: expected a single value, got a list ['auto']"),
    ({"specexit_window": [4, 8]}, "--specexit-window: expected a single value, got a list [4, 8]"),
])
def test_preset_values_errors_name_the_flag(values, message):
    with pytest.raises(ConfigError) as e:
        preset_values(values)
    assert str(e.value) == message


def test_method_list_is_the_combination():
    assert configs_from_mapping({"specexit_method": ("progress", "confidence")}).specexit.method == "confidence_progress"
    with pytest.raises(ConfigError, match=r"^--specexit-method: "):
        configs_from_mapping({"specexit_method": ["confidence", "speed"]})


@pytest.mark.parametrize("value,expected", [("on", "on"), ("off", "off"), (True, "on"), (False, "off"),
                                            ("false", "off"), ("True", "on"), ("0", "off")])
def test_online_costs_reads_boolean_spellings(value, expected):
    """``--dcut-online-costs``: default on; a YAML bare ``off`` arrives as false."""
    assert DCutConfig().online_costs == "on"
    cfg = configs_from_mapping({"dcut": "auto", "dcut_online_costs": value}).dcut
    assert cfg.online_costs == expected and cfg.corrects_costs == (expected == "on")
    assert not configs_from_mapping({"dcut": "0.5", "dcut_online_costs": value}).dcut.corrects_costs
