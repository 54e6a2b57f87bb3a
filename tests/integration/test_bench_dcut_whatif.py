"""``bench/dcut_throughput.py --what-if RESULT --what-if-table TABLE.json``: pure replay, no engine.

Replays the committed trained-model result (``bench/results/dcut_throughput_trained_cpu_chain16.json``:
the 15-step chain, N = 16 draft tokens, batch sizes 1..64) against small hand-written cost tables and
checks the printed tier choice, keep ratio and speed-ups against values computed here from the recorded
survival curves (top-K sums of ``bs`` copies of the curve, utilities ``(bs + S) / C``, argmax). Also: a
flat table keeps full verification, a table without a row for the largest batch size reports the
largest row (as the server does), the ``profile_cost.py --json`` wrapper is accepted, a version-2 table's
draft-off cost is replayed (speed-up ``(bs / off_ms) / (E_full / C_full)``), and the old
``--what-if-verify-scale`` replay still runs.

Budget: < 20 s CI (each call imports torch and replays 5 batch sizes).
"""

from __future__ import annotations

import json
import os
import re

import pytest

import bench_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = os.path.join(ROOT, "bench", "results", "dcut_throughput_trained_cpu_chain16.json")
TIERS = [0.25, 0.5, 0.75, 1.0]
BS = [1, 4, 16, 32, 64]
N = 16
#: GPU-like steep costs: verifying a quarter of the tokens is 5x cheaper than full at every bs.
STEEP = [[2.0, 6.0, 8.0, 10.0] for _ in BS]
FLAT = [[10.0, 10.0, 10.0, 10.0] for _ in BS]


def _bench():
    return bench_script.load("dcut_throughput")


def _table(path, step_ms, batch_sizes=BS, wrap=False, off_ms=None):
    t = {"version": 1 if off_ms is None else 2,
         "key": {"model": "m", "draft": "d", "device": "hypothetical-gpu", "tp": 1, "dtype": "bfloat16",
                 "draft_tokens": N, "topk": 1, "num_steps": 15, "attention_backend": "x", "context_len": 4096,
                 "sglang_version": "0.5.23", "sglang_ext_version": "0.1.0"},
         "tiers": TIERS, "batch_sizes": list(batch_sizes), "step_ms": step_ms,
         "created": "2026-01-01T00:00:00+00:00"}
    if off_ms is not None:
        t["off_ms"] = list(off_ms)
    with open(path, "w") as f:
        json.dump({"cost_table": t, "cost_table_info": {"source": "profiled"}} if wrap else t, f)
    return str(path)


def _recorded():
    with open(RESULT) as f:
        full = json.load(f)["dcut"]["full"]
    return {b: {"predicted": full[str(b)]["predicted_survival"], "measured": full[str(b)]["accept_survival"][1:]}
            for b in BS}


def _keeps(bs):
    # keep_count: ceil(bs * N * ratio) - bs draft slots (bonus-inclusive), written out here
    return [min(bs * (N - 1), max(0, -(-int(bs * N * r * 4) // 4) - bs)) for r in TIERS]


def _expected(curve, bs, costs):
    flat = sorted([x for x in curve for _ in range(bs)], reverse=True)
    e = [bs + sum(flat[:k]) for k in _keeps(bs)]
    u = [a / c for a, c in zip(e, costs)]
    q = max(range(len(u)), key=lambda i: (u[i], -costs[i], -i))
    return q, e, [x / u[-1] for x in u]


def _run(argv, capsys):
    _bench().main(argv)
    return capsys.readouterr().out


LABEL = {"predicted": "draft's predicted survival", "measured": "measured acceptance"}


def test_steep_table_picks_cheap_tiers_with_the_hand_computed_speedups(tmp_path, capsys):
    out = _run(["--what-if", RESULT, "--what-if-table", _table(tmp_path / "gpu.json", STEEP)], capsys)
    rec = _recorded()
    chosen = set()
    for i, bs in enumerate(BS):
        for name in ("predicted", "measured"):
            q, e, sp = _expected(rec[bs][name], bs, STEEP[i])
            chosen.add(TIERS[q])
            keep = (bs + _keeps(bs)[q]) / (bs * N)
            line = (f"bs={bs:>3} (table row bs={bs}), {LABEL[name]}: auto -> tier {TIERS[q]:g}, "
                    f"keep {keep:.3f}, speed-up {sp[q]:.2f}x over full")
            assert line in out, (line, out[-3000:])
            for t, ee, ss in zip(TIERS, e, sp):
                assert re.search(rf"^\s+{t:g}\s+\S+\s+{ee:.2f}\s+\S+\s+{ss:.2f}x$", out, re.M), (bs, name, t)
    # the steep table makes the cheap tier worth it: 0.25 is chosen for most batch sizes
    assert 0.25 in chosen
    # the module API returns the same choice
    res = _bench().what_if_table(json.load(open(RESULT)), str(tmp_path / "gpu.json"))
    q, _, sp = _expected(rec[64]["predicted"], 64, STEEP[-1])
    assert res[64]["predicted"]["tier"] == TIERS[q] and res[64]["predicted"]["auto_speedup"] == pytest.approx(sp[q])


def test_flat_table_keeps_full_verification(tmp_path, capsys):
    out = _run(["--what-if", RESULT, "--what-if-table", _table(tmp_path / "flat.json", FLAT)], capsys)
    for bs in BS:
        # predicted survival is > 0 at every slot: every kept draft adds expected tokens at no cost
        assert f"bs={bs:>3} (table row bs={bs}), draft's predicted survival: auto -> tier 1, keep 1.000, " \
               f"speed-up 1.00x over full" in out
        # measured acceptance can reach 0 along the tail: a smaller tier may tie, never beat, full
        assert re.search(rf"bs={bs:>3} \(table row bs={bs}\), measured acceptance: auto -> tier \S+, keep \S+, "
                         rf"speed-up 1\.00x over full", out)


def test_missing_row_reports_fallback_and_wrapped_table_is_read(tmp_path, capsys):
    path = _table(tmp_path / "wrapped.json", STEEP[:3], batch_sizes=[1, 4, 16], wrap=True)
    out = _run(["--what-if", RESULT, "--what-if-table", path], capsys)
    # beyond the table the server uses the largest row (sglang_ext.dcut.CostTable.lookup)
    assert "bs= 32: no table row >= 32 (largest 16); the server uses the costs of batch size 16" in out
    assert "bs= 64: no table row >= 64 (largest 16); the server uses the costs of batch size 16" in out
    assert "bs= 64 (table row bs=16), draft's predicted survival: auto -> tier" in out
    assert "bs= 16 (table row bs=16), draft's predicted survival: auto -> tier" in out


def test_verify_scale_replay_still_runs(capsys):
    out = _run(["--what-if", RESULT, "--what-if-verify-scale", "3"], capsys)
    assert "what-if: tier costs with the (cost - cost at tier 0.25) part scaled by 3.0" in out
    assert "what-if against" not in out


def test_version2_table_replays_the_draft_off_step(tmp_path, capsys):
    off = [3.0, 3.0, 3.0, 4.0, 5.0]  # ms of a draft-off step per batch size
    path = _table(tmp_path / "v2.json", STEEP, off_ms=off)
    out = _run(["--what-if", RESULT, "--what-if-table", path], capsys)
    rec = _recorded()
    for i, bs in enumerate(BS):
        q, e, _ = _expected(rec[bs]["measured"], bs, STEEP[i])
        full_rate = e[-1] / STEEP[i][-1]
        sp = (bs / off[i]) / full_rate  # bs committed tokens per draft-off step, against full verification
        assert re.search(rf"^\s+off\s+-\s+{float(bs):.2f}\s+{off[i]:.2f}\s+{sp:.2f}x$", out, re.M), (bs, sp)
    res = _bench().what_if_table(json.load(open(RESULT)), path)
    _, e, _ = _expected(rec[64]["predicted"], 64, STEEP[-1])
    assert res[64]["predicted"]["draft_off_speedup"] == pytest.approx((64 / off[-1]) / (e[-1] / STEEP[-1][-1]))


def test_invalid_table_is_one_line(tmp_path, capsys):
    path = _table(tmp_path / "bad.json", FLAT)
    with open(path) as f:
        t = json.load(f)
    t["created"] = "yesterday"
    with open(path, "w") as f:
        json.dump(t, f)
    assert _bench().main(["--what-if", RESULT, "--what-if-table", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --what-if-table: ") and "ISO 8601" in err[0]
