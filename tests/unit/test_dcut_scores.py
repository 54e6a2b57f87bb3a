"""Confidences and survival scores of ``sglang_ext.dcut.scores``.

References: ``torch.softmax`` for confidences, ``math.prod`` along Python-walked root paths
for survival scores; NaN/inf cases written out by hand.

Budget: < 3 s.
"""

import math
import random

import torch

from sglang_ext.dcut import (
    INELIGIBLE_SCORE,
    TreeTopology,
    chain_survival,
    confidence_from_logits,
    confidence_from_probs,
    tree_survival,
)
from test_dcut_reference import ancestors_or_self, random_parents

NAN = float("nan")
INF = float("inf")


def test_confidence_from_logits_is_max_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    probs = torch.softmax(logits.double(), dim=-1)
    got = confidence_from_logits(logits)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    assert torch.allclose(got.double(), probs.max(dim=-1).values, atol=1e-6)
    tok = torch.randint(0, 11, (3, 5), generator=g)
    got_tok = confidence_from_logits(logits, tok)
    assert torch.allclose(got_tok.double(), probs.gather(-1, tok.unsqueeze(-1)).squeeze(-1), atol=1e-6)


def test_confidence_from_logits_handles_extreme_and_bad_rows():
    logits = torch.tensor([
        [1000.0, 0.0, -1000.0],              # huge logits: no overflow, confidence 1
        [-INF, 2.0, -INF],                   # masked vocabulary: confidence 1
        [NAN, 0.0, 0.0],                     # NaN row: non-finite
        [-INF, -INF, -INF],                  # fully masked row: non-finite
    ])
    got = confidence_from_logits(logits)
    assert got[0].item() == 1.0 and got[1].item() == 1.0
    assert not torch.isfinite(got[2]) and not torch.isfinite(got[3])


def test_confidence_from_probs_gathers_sampled_token():
    probs = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    assert confidence_from_probs(probs, torch.tensor([1, 0, 1])).tolist() == [0.75, 0.5, 0.0]


def test_chain_survival_matches_prefix_products():
    rng = random.Random(0)
    for _ in range(50):
        bs, k = rng.randint(1, 5), rng.randint(1, 16)
        conf = [[rng.choice([1.0, 0.5, rng.random()]) for _ in range(k)] for _ in range(bs)]
        s = chain_survival(torch.tensor(conf))
        expected = [[math.prod(row[: j + 1]) for j in range(k)] for row in conf]
        assert torch.allclose(s.scores.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-7)
        assert int(s.num_nonfinite) == 0 and int(s.num_ineligible) == 0
        assert bool((s.scores[:, 1:] <= s.scores[:, :-1]).all())


def test_chain_survival_nonfinite_makes_suffix_ineligible_and_counts():
    conf = torch.tensor([
        [0.5, NAN, 0.9, 0.9],
        [INF, 0.5, 0.5, 0.5],
        [0.5, 0.5, 0.5, -INF],
        [1.5, -0.25, 0.5, 0.5],   # finite out-of-range values are clamped to [0, 1]
    ])
    s = chain_survival(conf)
    X = INELIGIBLE_SCORE
    assert s.scores.tolist() == [
        [0.5, X, X, X],
        [X, X, X, X],
        [0.5, 0.25, 0.125, X],
        [1.0, 0.0, 0.0, 0.0],
    ]
    assert int(s.num_nonfinite) == 3
    assert int(s.num_ineligible) == 3 + 4 + 1


def test_tree_survival_matches_path_products():
    rng = random.Random(1)
    for _ in range(60):
        bs, n = rng.randint(1, 4), rng.randint(1, 14)
        parents = [random_parents(rng, n) for _ in range(bs)]
        conf = [[rng.choice([1.0, 0.5, rng.random()]) for _ in range(n)] for _ in range(bs)]
        topo = TreeTopology.from_parents(torch.tensor(parents))
        s = tree_survival(torch.tensor(conf), topo)
        expected = [
            [math.prod(conf[b][u] for u in ancestors_or_self(parents[b], v) if u != 0) for v in range(n)]
            for b in range(bs)
        ]
        assert torch.allclose(s.scores.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-7)
        for b in range(bs):
            for v in range(1, n):
                assert s.scores[b, v] <= s.scores[b, parents[b][v]]


def test_tree_survival_nonfinite_subtree_and_unreachable():
    # 0 -> {1, 2}; 1 -> {3}; 3 -> {4}; node 5 is unreachable (parent NO_PARENT).
    topo = TreeTopology.from_parents(torch.tensor([[-1, 0, 0, 1, 3, -1]]))
    conf = torch.tensor([[NAN, INF, 0.5, 0.5, 0.5, 0.5]])  # the root's entry is ignored
    s = tree_survival(conf, topo)
    X = INELIGIBLE_SCORE
    assert s.scores.tolist() == [[1.0, X, 0.5, X, X, X]]
    assert int(s.num_nonfinite) == 1          # node 1 only (root ignored, node 5 unreachable)
    assert int(s.num_ineligible) == 4         # nodes 1, 3, 4 and the unreachable node 5
