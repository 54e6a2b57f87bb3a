"""Time left of the launch-time cost profile (``sglang_ext.dcut.profile_eta``): pure, no SGLang.

The demo shows it as the profiling progress bar's ETA, which must be right to within 2x at every
row. Checked against rows whose steps cost affine in the batch size (a fixed part from 10 % to 50 %
of the largest row's, the CPU testbed's range), plus a prefill that grows with the batch size and,
on the first row only, one-time costs up to 4x its steps (as a fresh CPU server measured: 6.8 s for
a bs-64 row whose steps cost about 1.5 s), with multiplicative noise; CPU and GPU-like batch sizes.

Budget: < 1 s.
"""

import random

import pytest

from sglang_ext.dcut.profile_eta import PRIOR_FIXED, RowTime, profile_order, remaining_seconds, row_seconds

CPU_SIZES = [1, 4, 8, 16, 32, 64]
GPU_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256]


def test_order_is_largest_then_smallest_then_the_rest():
    order = profile_order(sorted(CPU_SIZES, reverse=True))
    assert order[0] == 64 and order[1] == 1 and sorted(order) == CPU_SIZES
    assert list(order[2:]) == sorted(order[2:], reverse=True)
    assert profile_order([4, 1]) == (4, 1) and profile_order([1, 4]) == (4, 1)


def test_split_counts_every_step_of_the_row_at_its_median():
    r = RowTime.split(10.0, [200.0, 300.0, 500.0], 8)  # 3 columns x 8 steps
    assert r.steady_s == pytest.approx(8.0) and r.other_s == pytest.approx(2.0)
    assert RowTime.split(1.0, [200.0], 8).other_s == 0.0  # never negative


def test_interpolation_is_exact_on_affine_rows_and_ignores_the_first_rows_one_time_costs():
    def steady(b):
        return 3.0 + 0.5 * b

    def other(b):
        return 0.2 + 0.01 * b

    done = {64: RowTime(steady(64), other(64) + 50.0), 1: RowTime(steady(1), other(1)),
            16: RowTime(steady(16), other(16))}
    for b in (2, 8):
        assert row_seconds(done, b, first=64) == pytest.approx(steady(b) + other(b))
    assert remaining_seconds(done, [8, 4], first=64) == pytest.approx(steady(8) + other(8) + steady(4) + other(4))


def test_first_row_prior():
    first = {64: RowTime(8.0, 30.0)}
    assert row_seconds(first, 64, first=64) == pytest.approx(8.0)  # one-time costs not repeated
    assert row_seconds(first, 0, first=64) == pytest.approx(8.0 * PRIOR_FIXED)
    with pytest.raises(ValueError):
        row_seconds({}, 4, first=4)


@pytest.mark.parametrize("sizes", [CPU_SIZES, GPU_SIZES])
@pytest.mark.parametrize("fixed", [0.1, 0.25, 0.5])
def test_eta_within_2x_at_every_row(sizes, fixed):
    rng = random.Random(int(fixed * 100) + len(sizes))
    order = profile_order(sizes)
    b_max = max(sizes)
    for _ in range(20):
        one_time = rng.uniform(0.0, 4.0)
        prefill_share = rng.uniform(0.05, 0.3)  # of a row's steps
        rows, walls = {}, {}
        for b in sizes:
            steps = 10.0 * (fixed + (1 - fixed) * b / b_max) * rng.uniform(0.85, 1.15)
            other = prefill_share * 10.0 * b / b_max * rng.uniform(0.8, 1.2) + 0.05
            if b == order[0]:
                other += one_time * steps
            rows[b], walls[b] = RowTime(steps, other), steps + other
        done = {}
        for k, b in enumerate(order[:-1]):
            done[b] = rows[b]
            left = sum(walls[x] for x in order[k + 1:])
            eta = remaining_seconds(done, order[k + 1:], first=order[0])
            assert left / 2 <= eta <= 2 * left, (fixed, k, eta, left)
