"""Chain depth as a D-Cut tier (pure): the acceptance model along the chain, the expected accepted
drafts per depth, the depth choice with its hysteresis, and the draft-off choice fed with depth
gains. Budget: < 2 s.
"""

import random

import pytest

from sglang_ext.dcut import CostTable, CostTableKey, DraftOffParams, DraftOffState, draft_off_decision
from sglang_ext.dcut.depth import (
    NO_DEPTH,
    ChainAcceptance,
    DepthParams,
    DepthState,
    depth_decision,
    depth_gains,
    depth_tiers,
    expected_accepts,
    observe_chain_accepts,
)

KEY = CostTableKey("m", "d", "cpu", 1, "float32", 8, 1, 7, "t", 64, "0.5.23", "0.1")


def _mean_accept_from_distribution(rates, depth):
    """Mean accepted drafts from the explicit distribution of the accept length L:
    P(L = k) = p_1 ... p_k (1 - p_{k+1}) for k < depth, P(L = depth) = p_1 ... p_depth."""
    mean = 0.0
    for k in range(depth + 1):
        prob = 1.0
        for i in range(k):
            prob *= rates[i]
        if k < depth:
            prob *= 1.0 - rates[k]
        mean += k * prob
    return mean


def test_observe_counts_only_the_requests_that_reached_a_position():
    m = ChainAcceptance.empty(4)
    # accepted 0, 1, 1, 3 at depth 3: position 1 tried by 4 (3 accepted), 2 by 3 (1), 3 by 1 (1)
    m = observe_chain_accepts(m, [0, 1, 1, 3], depth=3, discount=0.5)
    assert m.accepted == (3.0, 1.0, 1.0, 0.0) and m.tried == (4.0, 3.0, 1.0, 0.0)
    assert m.rates(prior_weight=0.0) == pytest.approx((0.75, 1 / 3, 1.0, None))
    # a step where nobody passes position 1: positions 2.. untouched, position 1 discounted
    m = observe_chain_accepts(m, [0, 0], depth=3, discount=0.5)
    assert m.accepted == (1.5, 1.0, 1.0, 0.0) and m.tried == (4.0, 3.0, 1.0, 0.0)
    # depth 4, everything accepted: every position discounted and counted, the new one starts
    m = observe_chain_accepts(m, [4], depth=4, discount=0.5)
    assert m.accepted == (1.75, 1.5, 1.5, 1.0) and m.tried == (3.0, 2.5, 1.5, 1.0)
    # the prior as one pseudo-request: one rejection alone gives 0.25, not 0
    one = observe_chain_accepts(ChainAcceptance.empty(2), [0], depth=2)
    assert one.rates() == (0.25, None) and one.rates(prior_weight=0.0) == (0.0, None)


def test_a_batch_weighs_as_many_requests():
    """64 requests accepting and one rejecting: the rate is close to 64 / 65, whatever the order."""
    m = ChainAcceptance.empty(1)
    m = observe_chain_accepts(m, [1] * 64, depth=1, discount=1.0)
    m = observe_chain_accepts(m, [0], depth=1, discount=1.0)
    assert m.rates(prior_weight=0.0)[0] == pytest.approx(64 / 65)


@pytest.mark.parametrize("seed", range(5))
def test_expected_accepts_equals_the_mean_of_the_accept_length(seed):
    rng = random.Random(seed)
    rates = tuple(rng.uniform(0.0, 1.0) for _ in range(7))
    m = ChainAcceptance(tuple(10.0 * r for r in rates), (10.0,) * 7)  # rate = accepted / tried
    for depth in range(8):
        got = expected_accepts(m, depth, prior_weight=0.0)
        assert got == pytest.approx(_mean_accept_from_distribution(rates, depth))
    gains = depth_gains(m, range(8), prior_weight=0.0)
    assert all(b >= a for a, b in zip(gains, gains[1:]))  # never less for a deeper chain


def test_unobserved_positions_continue_the_deepest_observed_rate():
    m = ChainAcceptance((0.9, 0.6, 0.0, 0.0, 0.2), (1.0, 1.0, 0.0, 0.0, 1.0))
    # positions 3 and 4 take 0.6 (position 2's), position 5 its own 0.2
    want = _mean_accept_from_distribution((0.9, 0.6, 0.6, 0.6, 0.2), 5)
    assert expected_accepts(m, 5, prior_weight=0.0) == pytest.approx(want)
    assert expected_accepts(ChainAcceptance.empty(3), 3, prior=0.0) == 0.0
    assert expected_accepts(ChainAcceptance.empty(3), 3, prior=1.0) == 3.0


def test_the_model_learns_a_chain_it_samples():
    """Chains drawn with p = 0.9, 0.8, 0.7, ... at depth 5, 64 requests a step: the rates converge."""
    rng = random.Random(0)
    true = (0.9, 0.8, 0.7, 0.6, 0.5)
    m = ChainAcceptance.empty(7)
    for _ in range(300):
        counts = []
        for _ in range(64):
            k = 0
            while k < 5 and rng.random() < true[k]:
                k += 1
            counts.append(k)
        m = observe_chain_accepts(m, counts, depth=5)
    assert m.rates()[:5] == pytest.approx(true, abs=0.06) and m.rates()[5:] == (None, None)
    assert expected_accepts(m, 5) == pytest.approx(_mean_accept_from_distribution(true, 5), abs=0.15)


def test_depth_choice_is_the_best_utility_brute_force():
    rng = random.Random(3)
    depths = [1, 2, 3, 5, 7]
    for _ in range(50):
        costs = sorted(rng.uniform(1.0, 10.0) for _ in depths)  # deeper costs more
        t = CostTable.build(KEY, [8], [costs], tiers=depth_tiers(depths, 7))
        rates = tuple(rng.uniform(0.2, 1.0) for _ in range(7))
        m = ChainAcceptance(rates, (1.0,) * 7)
        gains = depth_gains(m, depths, prior_weight=0.0)
        d = depth_decision(DepthState(), 8, t, depths, gains)
        best = max(depths, key=lambda s: 8 * (1 + _mean_accept_from_distribution(rates, s)) / costs[depths.index(s)])
        assert d.depth == best and d.state == DepthState(best, 1)


def test_hysteresis_and_dwell():
    depths = [1, 3]
    t = CostTable.build(KEY, [8], [[4.0, 6.0]], tiers=depth_tiers(depths, 7))
    params = DepthParams(margin=0.1, min_dwell=2)
    g = depth_gains(ChainAcceptance((0.8,) * 7, (1.0,) * 7), depths, prior_weight=0.0)  # depth 3 is 9 % better
    seq, s = [], DepthState(1, 5)
    for _ in range(3):
        d = depth_decision(s, 8, t, depths, g, params)
        seq.append(d.depth)
        s = d.state
    assert seq == [1, 1, 1]  # within the 10 % margin: no switch, ever
    # depth 3: 8 * 3.439 / 6 = 4.59 against 3.8
    g = depth_gains(ChainAcceptance((0.9,) * 7, (1.0,) * 7), depths, prior_weight=0.0)
    s, seq = DepthState(1, 0), []
    for _ in range(3):
        d = depth_decision(s, 8, t, depths, g, params)
        seq.append(d.depth)
        s = d.state
    assert seq == [1, 1, 3]  # dwell 0, 1, then 2: switch


def test_draft_off_compares_against_the_depth_columns():
    """Depth gains and a table whose columns are depths feed the draft-off choice unchanged:
    at bs 64 a draft-off step costs 5 ms, depth 1 8 ms, depth 3 12 ms; with p = 0.3 drafting is
    worth at most 64 * 1.3 / 8 = 10.4 tokens/ms against 12.8 (23 % more: switch after the dwell)."""
    depths = [1, 3]
    t = CostTable.build(KEY, [64], [[8.0, 12.0]], tiers=depth_tiers(depths, 7), off_ms=[5.0])
    g = depth_gains(ChainAcceptance((0.3,) * 7, (1.0,) * 7), depths, prior_weight=0.0)
    d = draft_off_decision(DraftOffState(gains=g, dwell=8), 64, t, DraftOffParams())
    assert d.off and d.off_utility == pytest.approx(12.8) and d.draft_utility == pytest.approx(10.4)
    # depth 3: 64 * 3.439 / 12 = 18.3
    g = depth_gains(ChainAcceptance((0.9,) * 7, (1.0,) * 7), depths, prior_weight=0.0)
    assert not draft_off_decision(DraftOffState(gains=g, dwell=8), 64, t, DraftOffParams()).off


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="max_depth"):
        ChainAcceptance.empty(0)
    m = ChainAcceptance.empty(3)
    for bad_depth, counts in ((0, [0]), (4, [0]), (2, [3]), (2, [-1])):
        with pytest.raises(ValueError, match="chain depth"):
            observe_chain_accepts(m, counts, bad_depth)
    with pytest.raises(ValueError, match="discount"):
        observe_chain_accepts(m, [0], 1, discount=0.0)
    with pytest.raises(ValueError, match="depth"):
        expected_accepts(m, 4)
    with pytest.raises(ValueError, match="prior"):
        expected_accepts(m, 1, prior=1.5)
    for bad in ([], [0, 1], [3, 2], [1, 8]):
        with pytest.raises(ValueError, match="strictly increasing"):
            depth_tiers(bad, 7)
    t = CostTable.build(KEY, [8], [[4.0, 6.0]], tiers=depth_tiers([1, 3], 7))
    with pytest.raises(ValueError, match="must match"):
        depth_decision(DepthState(), 8, t, [1, 3, 5], (0.5, 0.7, 0.8))
    with pytest.raises(ValueError, match="batch_size"):
        depth_decision(DepthState(), 0, t, [1, 3], (0.5, 0.7))
    for kw in ({"margin": -1.0}, {"min_dwell": 0}, {"discount": 2.0}, {"prior": -0.1}, {"prior_weight": -1.0}):
        with pytest.raises(ValueError, match="chain depth"):
            DepthParams(**kw)
    assert DepthState().depth == NO_DEPTH
