"""``bench/dcut_throughput.py`` end to end on engines, trained testbed models, tiny runs.

The acceptance runs (bs 1-64, ``bench/README.md``) put every peer side by side in one run: no
speculation, full verification, each fixed tier, ``--dcut auto`` with ``--dcut-draft-off never``
and ``auto``, and SGLang's ``--speculative-adaptive`` where SGLang supports the shape (chains).
Here one small batch (bs 4, 32 new tokens on the tree, 16 on the chain, one repeat) checks that:

* CI, the 16-token EAGLE3 tree (SGLang's documented 3 steps / topk 4 / 16 tokens): the D-Cut
  engine and the ``auto-never`` engine on a hand-written version-2 cost table whose draft-off step
  is cheap at bs 4 (nothing profiled, both engines start together), so ``auto`` really runs steps
  without drafting while ``auto-never`` never does; every mode's output equals full verification
  token for token; the fixed tiers verify fewer tokens (tier 0.25: at most ceil(bs * 16 * 0.25)
  per step); ``off`` (the opt-in forced draft-off mode) runs only draft-off steps; ``adaptive`` is
  printed ``n/a`` with SGLang's topk reason; the printed ratio rows (best-of and paired) equal the
  ratios computed here from the JSON's ``tok_s`` / ``tok_s_runs``; the PNG is written.
* slow tier, ``--modes no-spec,auto,off`` on the tree: only those three are measured (lossless
  against no speculation, auto/nospec and off/nospec printed and saved).
* slow tier, the 15-step chain: all four engines (no speculation, D-Cut, auto-never, SGLang
  adaptive), the cost table profiled at launch (schema version 2 with draft-off costs) in a fresh
  cache directory; every mode, no speculation and adaptive included, equals full verification;
  SGLang really runs adaptive; ``auto/peak`` and ``auto/adaptive`` printed equal the JSON's.

Throughput figures are printed, never asserted (noisy host).

Budget: CI ~60-110 s (two engine starts side by side, 7 modes x 2 short runs; 107 s measured at load
average 5 on the shared 2-core host); slow tier ~3-6 min for the chain (four engine starts, a profile
of bs 1 and 4, 8 modes; 335 s measured at load average 5) and ~1.5 min for the modes subset.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINED = os.path.join(ROOT, "sglang_ext", "testbed", "models")
DCUT_ENGINE_MODES = ("full", "r0.25", "r0.5", "r0.75", "auto")
FIXED = ("r0.25", "r0.5", "r0.75")
BS = 4
N = 16


def _skip_without_models():
    if not all(os.path.isfile(os.path.join(TRAINED, d, "config.json")) for d in ("target", "draft")):
        pytest.skip("trained testbed models are not in this checkout")


def _bench(tmp, name, args, new_tokens=16):
    png, js = tmp / f"{name}.png", tmp / f"{name}.json"
    argv = [*args, "--batch-sizes", str(BS), "--repeats", "1", "--max-new-tokens", str(new_tokens),
            "--max-running-requests", str(BS), "--out", str(png), "--json", str(js)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join("bench", "dcut_throughput.py"), *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(js) as f:
        res = json.load(f)
    return proc.stdout, res, png


def _table_file(path, topk, steps):
    """Tier costs grow with the tier; a draft-off step (2 ms) is far cheaper than any tier at bs 4."""
    from sglang_ext.dcut import CostTable, CostTableKey

    key = CostTableKey("hand-written", "hand-written", "cpu", 1, "float32", N, topk, steps, "torch_sdpa", 64,
                       "0.5.23", "test")
    CostTable.build(key, [1, 4], [[10, 20, 30, 40], [12, 24, 36, 48]], tiers=(0.25, 0.5, 0.75, 1.0),
                    off_ms=[50, 2]).save(path)
    return str(path)


def _expected_ratios(tps: dict) -> dict:
    """The ratio rows, written out here from one set of tok/s per mode."""
    fixed = [tps[m] for m in FIXED]
    peak = max([tps["full"], *fixed] + ([tps["no-spec"]] if "no-spec" in tps else []))
    out = {"auto/full": tps["auto"] / tps["full"], "auto/best": tps["auto"] / max(fixed),
           "best/full": max(fixed) / tps["full"], "auto/peak": tps["auto"] / peak}
    if "auto-never" in tps:
        out["auto/never"] = tps["auto"] / tps["auto-never"]
        out["never/peak"] = tps["auto-never"] / peak
    if "no-spec" in tps:
        out["auto/nospec"] = tps["auto"] / tps["no-spec"]
        out["full/nospec"] = tps["full"] / tps["no-spec"]
    if "adaptive" in tps:
        out["auto/adaptive"] = tps["auto"] / tps["adaptive"]
        out["adaptive/peak"] = tps["adaptive"] / peak
    if "auto-depth" in tps:
        out["depth/peak"] = tps["auto-depth"] / peak
        if "adaptive" in tps:
            out["depth/adaptive"] = tps["auto-depth"] / tps["adaptive"]
        if "no-spec" in tps:
            out["depth/nospec"] = tps["auto-depth"] / tps["no-spec"]
    return out


def _printed(out: str, header: str) -> dict:
    """{row: value at the one batch size} of the ratio section starting with ``header``."""
    section = out.split(header, 1)[1].split("\n\n", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\S+/\S+)\s+(\S+)$", section, re.M)}


def _check_printed_ratios(out, res):
    best_of = {m: v[str(BS)] for m, v in res["tok_s"].items()}
    runs = {m: v[str(BS)][0] for m, v in res["tok_s_runs"].items()}  # one repeat: the paired median is it
    for header, tps in (("ratios of the best-of-repeats", best_of), ("paired ratios", runs)):
        printed = _printed(out, header)
        want = _expected_ratios(tps)
        assert set(want) <= set(printed), (header, sorted(want), printed)
        for name, v in want.items():
            assert abs(float(printed[name]) - v) <= 0.0051, (header, name, printed[name], v)
    for name, v in _expected_ratios(runs).items():
        assert res["paired_ratios"][str(BS)][name] == pytest.approx(v), name
    return _printed(out, "paired ratios")


@pytest.fixture(scope="module")
def tree16_run(tmp_path_factory):
    _skip_without_models()
    tmp = tmp_path_factory.mktemp("bench_tree16")
    # every mode but no-spec, plus the opt-in 'off' (adaptive named so that its n/a row is printed)
    args = ["--num-steps", "3", "--topk", "4", "--num-draft-tokens", str(N),
            "--modes", ",".join((*DCUT_ENGINE_MODES, "auto-never", "off", "adaptive")),
            "--cost-table", _table_file(tmp / "table.json", 4, 3), "--cache-dir", str(tmp / "cache")]
    # 32 new tokens: auto's draft-off choice needs its minimum dwell of drafted steps first
    return _bench(tmp, "tree16", args, new_tokens=32)


def test_every_mode_is_lossless_and_measured(tree16_run):
    out, res, _ = tree16_run
    assert res["settings"]["topk"] == 4 and res["settings"]["num_steps"] == 3
    modes = DCUT_ENGINE_MODES + ("auto-never", "off")
    assert res["lossless_vs_full"] == {m: True for m in modes}, res["lossless_vs_full"]
    for m in modes:
        assert res["tok_s"][m][str(BS)] > 0 and len(res["tok_s_runs"][m][str(BS)]) == 1, (m, res["tok_s"][m])
    assert "paired ratios" in out and "lossless vs full verify" in out
    assert res["cost_table_info"]["source"] == "file" and res["cost_table"]["off_ms"] == [50, 2]


def test_auto_drafts_off_and_auto_never_does_not(tree16_run):
    out, res, _ = tree16_run
    auto, never = res["dcut"]["auto"][str(BS)], res["dcut"]["auto-never"][str(BS)]
    # the table makes a draft-off step 6x cheaper than the cheapest tier at bs 4
    assert auto["draft_off_steps"] > 0 and auto["tier_histogram"].get("draft_off") == auto["draft_off_steps"], auto
    assert never["draft_off_steps"] == 0 and "draft_off" not in never["tier_histogram"], never
    off = res["dcut"]["off"][str(BS)]  # the D-Cut engine forced draft-off: only draft-off steps
    assert off["steps"] > 0 and off["tier_histogram"] == {"draft_off": off["steps"]}, off
    assert re.search(r"bs=  4: keep \S+  tiers .*draft_off.*draft-off share (0\.[1-9]|1\.00)", out), out


def test_fixed_tiers_verify_fewer_tokens(tree16_run):
    _, res, _ = tree16_run
    stats = {m: res["dcut"][m][str(BS)] for m in DCUT_ENGINE_MODES}
    full = stats["full"]
    assert full["steps"] > 0 and full["verified_tokens"] == full["full_tokens"], full
    for m, ratio in (("r0.25", 0.25), ("r0.5", 0.5), ("r0.75", 0.75)):
        st = stats[m]
        assert st["steps"] > 0 and st["pruned_steps"] > 0 and st["draft_off_steps"] == 0, (m, st)
        # a step of b requests verifies at most ceil(b * N * ratio) tokens (bonus slots included)
        assert st["verified_tokens"] <= math.ceil(BS * N * ratio) * st["steps"], (m, st)
        assert st["verified_tokens"] < st["full_tokens"], (m, st)
    assert sum(stats["auto"]["tier_histogram"].values()) == stats["auto"]["steps"]


def test_printed_ratios_equal_the_json_and_adaptive_is_na_on_trees(tree16_run):
    out, res, png = tree16_run
    printed = _check_printed_ratios(out, res)
    # SGLang's adaptive mode runs chains only: n/a, with the reason, in the table and the ratio rows
    assert res["adaptive"]["status"] == "n/a" and "topk 4" in res["adaptive"]["reason"]
    assert re.search(r"^adaptive\s+n/a\s+\(SGLang's --speculative-adaptive supports only "
                     r"--speculative-eagle-topk 1", out, re.M), out
    assert printed["auto/adaptive"] == "n/a" and "adaptive" not in res["tok_s"]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_modes_subset_measures_only_no_spec_auto_and_off(tmp_path):
    """``--modes no-spec,auto,off`` (the long draft-off runs): only those modes are measured, the
    lossless check compares them with no speculation, auto/nospec and off/nospec are printed and
    saved; ``off`` (the D-Cut engine forced draft-off) runs only draft-off steps."""
    _skip_without_models()
    args = ["--num-steps", "3", "--topk", "4", "--num-draft-tokens", str(N), "--modes", "no-spec,auto,off",
            "--cost-table", _table_file(tmp_path / "table.json", 4, 3), "--cache-dir", str(tmp_path / "cache")]
    out, res, _ = _bench(tmp_path, "modes", args, new_tokens=32)
    assert sorted(res["tok_s"]) == ["auto", "no-spec", "off"], res["tok_s"]
    assert res["lossless_reference"] == "no-spec"
    assert res["lossless_vs_full"] == {"no-spec": True, "auto": True, "off": True}
    assert "lossless vs no-spec" in out
    runs = {m: v[str(BS)][0] for m, v in res["tok_s_runs"].items()}
    assert res["paired_ratios"][str(BS)] == {"auto/nospec": pytest.approx(runs["auto"] / runs["no-spec"]),
                                             "off/nospec": pytest.approx(runs["off"] / runs["no-spec"])}
    printed = _printed(out, "paired ratios")
    assert abs(float(printed["auto/nospec"]) - runs["auto"] / runs["no-spec"]) <= 0.0051
    assert abs(float(printed["off/nospec"]) - runs["off"] / runs["no-spec"]) <= 0.0051
    auto, off = res["dcut"]["auto"][str(BS)], res["dcut"]["off"][str(BS)]
    assert auto["draft_off_steps"] > 0, auto
    assert off["steps"] > 0 and off["tier_histogram"] == {"draft_off": off["steps"]}, off


@pytest.mark.slow
def test_chain_all_peers_with_a_fresh_profile(tmp_path):
    _skip_without_models()
    out, res, _ = _bench(tmp_path, "chain16", ["--num-steps", "15", "--num-draft-tokens", str(N),
                                               "--profile-steps", "2"])
    modes = ("no-spec",) + DCUT_ENGINE_MODES + ("auto-never", "auto-depth", "adaptive")
    assert res["lossless_vs_full"] == {m: True for m in modes}, res["lossless_vs_full"]
    # D-Cut's depth mode ran its own steps (depth histogram keys) next to SGLang's adaptive policy
    depth = res["dcut"]["auto-depth"][str(BS)]
    assert depth["steps"] > 0 and any(k.startswith("steps=") for k in depth["tier_histogram"]), depth
    # profiled at launch (not a cached table), schema version 2 with a draft-off cost per batch size
    assert res["cost_table_info"]["source"] == "profiled", res["cost_table_info"]
    table = res["cost_table"]
    assert table["version"] == 2 and table["batch_sizes"][-1] == BS
    assert len(table["off_ms"]) == len(table["batch_sizes"]) and all(x > 0 for x in table["off_ms"])
    # SGLang ran its adaptive mode (not the static fallback) with the chain's steps among its candidates
    assert res["adaptive"]["status"] == "measured" and res["adaptive"]["server"]["speculative_adaptive"] is True
    assert 15 in res["adaptive"]["config"]["1"]["candidate_steps"]
    assert res["tokens_per_verify"]["adaptive"][str(BS)] > 1.0  # drafts were accepted
    printed = _check_printed_ratios(out, res)
    assert float(printed["auto/peak"]) > 0 and float(printed["auto/adaptive"]) > 0
    assert float(printed["depth/adaptive"]) > 0


def test_sequential_packed_gemm_run(tmp_path):
    """``--sequential --packed-gemm 4 --modes no-spec,full,auto`` on the 4-token chain: one engine at a
    time (no-spec, no-spec-packed, the D-Cut engine), each lossless against no speculation; the packed
    engines really ran blocked GEMMs is checked by tests/integration/test_cpu_packed_gemm_engine.py,
    here the bench's bookkeeping: the modes measured, the nospecpacked/nospec ratio printed and saved."""
    _skip_without_models()
    table = tmp_path / "table4.json"
    from sglang_ext.dcut import CostTable, CostTableKey

    key = CostTableKey("hand-written", "hand-written", "cpu", 1, "float32", 4, 1, 3, "torch_sdpa", 64, "0.5.23", "test")
    CostTable.build(key, [1, 4], [[10, 20, 30, 40], [12, 24, 36, 48]], tiers=(0.25, 0.5, 0.75, 1.0),
                    off_ms=[50, 60]).save(str(table))
    args = ["--num-steps", "3", "--topk", "1", "--num-draft-tokens", "4", "--modes", "no-spec,full,auto",
            "--sequential", "--packed-gemm", "4", "--cost-table", str(table), "--cache-dir", str(tmp_path / "cache")]
    out, res, _ = _bench(tmp_path, "sequential", args)
    assert sorted(res["tok_s"]) == ["auto", "full", "no-spec", "no-spec-packed"], res["tok_s"]
    assert res["lossless_vs_full"] == {m: True for m in res["tok_s"]}, res["lossless_vs_full"]
    assert res["adaptive"]["status"] == "n/a" and "--sequential" in res["adaptive"]["reason"]
    assert res["settings"]["packed_gemm"] == 4 and res["settings"]["sequential"]
    runs = {m: v[str(BS)][0] for m, v in res["tok_s_runs"].items()}
    want = runs["no-spec-packed"] / runs["no-spec"]
    assert res["paired_ratios"][str(BS)]["nospecpacked/nospec"] == pytest.approx(want)
    assert abs(float(_printed(out, "paired ratios")["nospecpacked/nospec"]) - want) <= 0.0051
    assert res["dcut"]["full"][str(BS)]["steps"] > 0
