"""Online power calibration of D-Cut survival scores (``sglang_ext.dcut.calibration``), no SGLang.

* ``solve_power`` against an independent fine grid scan of the moment equation;
* a simulated stream of chain drafts whose true acceptance is ``s ** tau_true``: the fitted
  ``tau`` converges to ``tau_true`` from full and from pruned (top-K kept) observations, and
  follows a change of ``tau_true`` through the decay;
* ``apply`` is strictly increasing on ``(0, 1]`` and leaves 0 / ineligible / NaN alone, so the
  planner keeps exactly the same slots at any budget with calibrated scores;
* no ``tau`` before ``min_kept`` observations; bad settings raise.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from sglang_ext import dcut
from sglang_ext.dcut import calibration
from sglang_ext.dcut.calibration import PowerCalibration, solve_power
from sglang_ext.dcut.scores import INELIGIBLE_SCORE, chain_survival


def test_doctests():
    assert doctest.testmod(calibration).failed == 0


@pytest.mark.parametrize("seed", range(30))
def test_solve_power_matches_a_grid_scan(seed):
    gen = torch.Generator().manual_seed(seed)
    bins = int(torch.randint(1, 20, (1,), generator=gen))
    counts = torch.rand(bins, generator=gen, dtype=torch.float64) * 50
    mean_log = -torch.rand(bins, generator=gen, dtype=torch.float64) * 6
    accepted = float(torch.rand(1, generator=gen, dtype=torch.float64)) * float(counts.sum())
    tau = solve_power(counts, mean_log, accepted, 0.25, 8.0)
    grid = [0.25 + i * 1e-4 for i in range(int((8.0 - 0.25) / 1e-4) + 1)]
    # independent: the first grid point whose prediction falls to the accepted total
    pred = lambda t: sum(float(c) * math.exp(t * float(m)) for c, m in zip(counts, mean_log))  # noqa: E731
    lo, hi = 0, len(grid) - 1
    while lo < hi:  # bisection over the grid indices (the prediction is decreasing in tau)
        mid = (lo + hi) // 2
        if pred(grid[mid]) > accepted:
            lo = mid + 1
        else:
            hi = mid
    assert abs(tau - grid[lo]) <= 2e-4 or (grid[lo] in (0.25, 8.0) and abs(tau - grid[lo]) < 1e-9)


def _stream(cal: PowerCalibration, tau_true: float, steps: int, gen: torch.Generator, keep_fraction: float = 1.0,
            bs: int = 32, slots: int = 15):
    for _ in range(steps):
        conf = 0.55 + 0.45 * torch.rand(bs, slots, generator=gen)
        surv = chain_survival(conf).scores  # [bs, slots], non-increasing per row
        true_p = surv.pow(tau_true)
        # a chain accepts slot k iff it accepts every earlier slot: draw the accept length from
        # the true survival curve, P(len >= k + 1) = true_p[:, k]
        u = torch.rand(bs, 1, generator=gen)
        accept_len = (u < true_p).sum(dim=1)  # [bs], true_p decreasing -> a prefix count
        keep_len = torch.full((bs,), slots)
        if keep_fraction < 1.0:  # a global top-K budget, as the planner keeps
            plan = dcut.choose(surv, None, (keep_fraction, 1.0), keep_fraction)
            keep_len = plan.keep_lens.cpu()
        kept = torch.arange(slots).view(1, -1) < keep_len.view(-1, 1)
        accepted = torch.minimum(accept_len, keep_len).sum().float()
        if keep_fraction < 1.0 and gen.initial_seed() % 2:
            cal.observe(surv, accepted, kept=kept)  # the glue's form: a mask, no boolean indexing
        else:
            cal.observe(surv[kept], accepted)


@pytest.mark.parametrize("tau_true,keep", [(1.0, 1.0), (2.6, 1.0), (0.6, 1.0), (2.6, 0.5), (1.8, 0.25)])
def test_fitted_tau_converges(tau_true, keep):
    gen = torch.Generator().manual_seed(int(tau_true * 100 + keep * 10))
    cal = PowerCalibration(refit_interval=8, decay=0.95)
    _stream(cal, tau_true, 400, gen, keep_fraction=keep)
    assert abs(cal.tau - tau_true) < 0.12 * tau_true, cal.summary()
    s = cal.summary()
    assert s["refits"] == 50 and s["kept_weight"] > 0 and s["accepted_weight"] > 0


def test_tau_follows_a_change_of_the_draft():
    gen = torch.Generator().manual_seed(3)
    cal = PowerCalibration(refit_interval=8, decay=0.8)
    _stream(cal, 3.0, 200, gen)
    first = cal.tau
    _stream(cal, 1.2, 200, gen)
    assert abs(first - 3.0) < 0.4 and abs(cal.tau - 1.2) < 0.2


def test_no_tau_before_enough_observations_and_no_refit_between_intervals():
    cal = PowerCalibration(refit_interval=4, min_kept=100.0)
    for _ in range(3):
        cal.observe(torch.full((10,), 0.5), torch.tensor(0.0))
    assert cal.refits == 0 and cal.tau == 1.0  # no refit yet
    cal.observe(torch.full((10,), 0.5), torch.tensor(0.0))
    assert cal.refits == 1 and cal.tau == 1.0  # 40 kept < min_kept
    for _ in range(8):
        cal.observe(torch.full((10,), 0.5), torch.tensor(0.0))
    assert cal.tau == cal.tau_max  # nothing ever accepted


def test_mask_form_equals_subset_form():
    gen = torch.Generator().manual_seed(11)
    a, b = PowerCalibration(refit_interval=1, min_kept=1.0), PowerCalibration(refit_interval=1, min_kept=1.0)
    for _ in range(5):
        s = torch.rand(6, 7, generator=gen)
        s[0, 3] = INELIGIBLE_SCORE
        kept = torch.rand(6, 7, generator=gen) < 0.6
        acc = torch.tensor(float(torch.randint(0, 10, (1,), generator=gen)))
        a.observe(s[kept], acc)
        b.observe(s, acc, kept=kept)
    assert a.summary()["kept_weight"] == b.summary()["kept_weight"]
    assert abs(a.tau - b.tau) < 1e-9


def test_non_finite_and_zero_scores_are_not_observed():
    cal = PowerCalibration(refit_interval=1, min_kept=1.0)
    bad = torch.tensor([0.0, -1.0, INELIGIBLE_SCORE, float("nan"), float("inf")])
    cal.observe(torch.cat([bad, torch.full((4,), 0.25)]), torch.tensor(1.0))
    assert cal.summary()["kept_weight"] == 4.0
    assert abs(cal.tau - 1.0) < 1e-6  # 4 * 0.25 == 1 accepted


@pytest.mark.parametrize("seed", range(20))
def test_apply_keeps_the_order_and_the_kept_set(seed):
    gen = torch.Generator().manual_seed(seed)
    cal = PowerCalibration()
    cal.tau = float(0.3 + 4 * torch.rand(1, generator=gen))
    conf = torch.rand(8, 15, generator=gen)
    conf[conf < 0.05] = float("nan")  # some ineligible tails
    surv = chain_survival(conf).scores
    cal_s = cal.apply(surv)
    finite = torch.isfinite(surv) & (surv > 0)
    assert torch.equal(torch.isnan(cal_s), torch.isnan(surv))
    assert torch.equal(cal_s[~finite].nan_to_num(nan=-7.0), surv[~finite].nan_to_num(nan=-7.0))
    a, b = surv[finite], cal_s[finite]
    order = torch.argsort(a)
    assert bool((b[order][1:] >= b[order][:-1]).all())  # non-decreasing on the sorted raw scores
    for ratio in (0.25, 0.5, 0.75):
        raw_plan = dcut.choose(surv, None, (0.25, 0.5, 0.75, 1.0), ratio)
        cal_plan = dcut.choose(cal_s, None, (0.25, 0.5, 0.75, 1.0), ratio)
        assert torch.equal(raw_plan.keep_lens, cal_plan.keep_lens)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"num_bins": 0}, "num_bins"), ({"log_min": 0.0}, "log_min"), ({"decay": 0.0}, "decay"),
     ({"refit_interval": 0}, "refit_interval"), ({"tau_min": 1.5}, "tau_min"), ({"tau_max": 0.5}, "tau_max")],
)
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerCalibration(**kwargs)
