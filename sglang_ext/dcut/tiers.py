"""Verify-size tiers: keep counts, the auto objective and fixed ratios.

Keep-count convention (docs/algorithms.md#d-cut-keep-count, **project rule**: bonus-inclusive, as vLLM #47131):

    keep_q = min(bs * K, max(0, ceil(bs * N * rho_q) - bs))        (draft slots kept)

so the target-forward width of tier q is ``bs + keep_q = ceil(bs * N * rho_q)``, an exact
fraction of the full verify width ``bs * N``. Keep ratios in metrics are reported the same way
(bonus slots included). The D-Cut page instead writes ``K_q = ceil(rho_q * bs * (N - 1))``
(a fraction of the *draft* tokens; :func:`page_keep_count`, documentation only): for
DFlash-B16 at bs = 64 the tiers keep 192/448/704/960 drafts here versus 240/480/720/960 there.
The ceiling is taken with exact rational arithmetic (``Fraction(str(rho))``), never a float
ceil: ``ceil(100 * 0.07)`` is 8 in floating point but 7 exactly.

Auto choice (B.5): ``q* = argmax_q (bs + S(keep_q)) / C(bs', rho_q)`` with ``S`` the sum of the
``keep_q`` largest survival scores and ``bs'`` the smallest profiled batch size >= bs; exact
ties go to the cheaper tier (then the lower one).
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Sequence, Union

__all__ = [
    "DEFAULT_TIERS",
    "FALLBACK_RATIO",
    "NO_TIER",
    "as_fraction",
    "keep_count",
    "page_keep_count",
    "tier_keep_counts",
    "smallest_fitting_tier",
    "best_utility_index",
]

DEFAULT_TIERS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
FALLBACK_RATIO = 0.75
NO_TIER = -1

Ratio = Union[float, str, Fraction]


def as_fraction(ratio: Ratio) -> Fraction:
    """Exact rational value of a ratio as written (``Fraction(str(ratio))`` for floats).

    Raises
    ------
    ValueError
        If the ratio is not in ``(0, 1]``.

    Examples
    --------
    >>> as_fraction(0.07)
    Fraction(7, 100)
    """
    if isinstance(ratio, Fraction):
        fr = ratio
    elif isinstance(ratio, bool):
        raise ValueError(f"D-Cut ratio must be a number in (0, 1], got {ratio!r}")
    else:
        try:
            fr = Fraction(str(ratio).strip())
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"D-Cut ratio must be a number in (0, 1], got {ratio!r}") from exc
    if not (0 < fr <= 1):
        raise ValueError(f"D-Cut ratio must be in (0, 1], got {ratio!r}")
    return fr


def _ceil_fraction(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def keep_count(batch_size: int, num_draft_tokens: int, ratio: Ratio) -> int:
    """Draft slots kept at tier ratio ``ratio`` (bonus-inclusive convention).

    ``min(bs * (N - 1), max(0, ceil(bs * N * ratio) - bs))``, computed exactly.

    Parameters
    ----------
    batch_size : int
        ``bs``.
    num_draft_tokens : int
        ``N`` (verify tokens per request, root/bonus included).
    ratio : float, str or Fraction
        Tier ratio in ``(0, 1]``.

    Returns
    -------
    int
        Kept draft slots across the batch.

    Examples
    --------
    DFlash-B16 (N = 16) at bs = 64, and the EAGLE3 default chain (N = 4) at bs = 8::

        >>> [keep_count(64, 16, r) for r in (0.25, 0.5, 0.75, 1.0)]
        [192, 448, 704, 960]
        >>> [keep_count(8, 4, r) for r in (0.25, 0.5, 0.75, 1.0)]
        [0, 8, 16, 24]
    """
    fr = as_fraction(ratio)
    width = _ceil_fraction(batch_size * num_draft_tokens * fr)
    return min(batch_size * (num_draft_tokens - 1), max(0, width - batch_size))


def page_keep_count(batch_size: int, num_draft_tokens: int, ratio: Ratio) -> int:
    """The D-Cut page's keep count ``ceil(ratio * bs * (N - 1))`` (documentation/comparison only).

    Examples
    --------
    >>> [page_keep_count(64, 16, r) for r in (0.25, 0.5, 0.75, 1.0)]
    [240, 480, 720, 960]
    """
    fr = as_fraction(ratio)
    return _ceil_fraction(batch_size * (num_draft_tokens - 1) * fr)


def tier_keep_counts(
    batch_size: int, num_draft_tokens: int, tiers: Sequence[Ratio] = DEFAULT_TIERS
) -> list[int]:
    """:func:`keep_count` for every tier.

    Examples
    --------
    >>> tier_keep_counts(4, 16)
    [12, 28, 44, 60]
    """
    return list(_tier_keep_counts_cached(int(batch_size), int(num_draft_tokens), tuple(tiers)))


@functools.lru_cache(maxsize=4096)
def _tier_keep_counts_cached(batch_size: int, num_draft_tokens: int, tiers: tuple) -> tuple[int, ...]:
    # Exact rational arithmetic costs tens of microseconds per tier; the planner asks for the
    # same (bs, N, tiers) every step.
    return tuple(keep_count(batch_size, num_draft_tokens, r) for r in tiers)


def smallest_fitting_tier(keep: int, tier_keeps: Sequence[int]) -> int:
    """Index of the smallest tier whose keep count is at least ``keep`` (``NO_TIER`` if none).

    Used by fixed-ratio mode: the verify runs in the smallest captured tier that fits.

    Examples
    --------
    >>> smallest_fitting_tier(30, [12, 28, 44, 60]), smallest_fitting_tier(61, [12, 60])
    (2, -1)
    """
    best = NO_TIER
    for i, k in enumerate(tier_keeps):
        if k >= keep and (best == NO_TIER or k < tier_keeps[best]):
            best = i
    return best


def best_utility_index(utilities: Sequence[float], costs: Sequence[float]) -> int:
    """Argmax of ``utilities``; exact ties go to the lower cost, then to the lower index.

    Examples
    --------
    >>> best_utility_index([1.0, 2.0, 2.0], [3.0, 5.0, 4.0])
    2
    """
    best = 0
    for i in range(1, len(utilities)):
        u, ub = utilities[i], utilities[best]
        if u > ub or (u == ub and costs[i] < costs[best]):
            best = i
    return best

