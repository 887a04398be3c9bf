"""Metrics against hand-computed values and a brute-force NDCG definition."""

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.metrics import latency_summary, ranking_metrics, user_metrics


def test_single_target_hand_values():
    hr, rec, ndcg = user_metrics([5, 7, 9], [7], k=3)
    assert hr == 1 and rec == 1 and ndcg == pytest.approx(1 / math.log2(3))
    assert user_metrics([5, 7, 9], [7], k=1) == (0.0, 0.0, 0.0)


def test_multi_target_recall_and_ideal_dcg():
    hr, rec, ndcg = user_metrics([1, 2, 3, 4], [2, 4, 8], k=4)
    assert hr == 1 and rec == pytest.approx(2 / 3)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / ideal)


def test_duplicates_and_invalid_items_never_hit_twice():
    assert user_metrics([3, 3, -1], [3], k=3)[1] == 1.0
    assert user_metrics([-1, -1], [3], k=2) == (0.0, 0.0, 0.0)


@settings(max_examples=100, deadline=None)
@given(
    ranked=st.lists(st.integers(0, 15), max_size=12, unique=True),
    targets=st.lists(st.integers(0, 15), min_size=1, max_size=5, unique=True),
    k=st.integers(1, 12),
)
def test_bounds_and_consistency(ranked, targets, k):
    m = ranking_metrics([ranked], [targets], [k])
    assert 0 <= m[f"recall@{k}"] <= m[f"hr@{k}"] <= 1
    assert 0 <= m[f"ndcg@{k}"] <= 1 + 1e-12
    # a perfect ranking has NDCG 1
    assert ranking_metrics([targets], [targets], [k])[f"ndcg@{k}"] == pytest.approx(1.0)


def test_latency_summary():
    s = latency_summary(list(range(1, 101)))
    assert s["p50"] == pytest.approx(50.5) and s["p99"] == pytest.approx(99.01) and s["mean"] == 50.5
    assert latency_summary([]) == {}


def test_paired_permutation_test_detects_a_real_difference_and_not_a_null_one():
    import numpy as np

    from genrec.workloads.metrics import paired_permutation_test, user_metric_vector

    rng = np.random.default_rng(0)
    base = rng.random(400)
    better = paired_permutation_test(base + 0.05, base, resamples=2000)
    assert better["p_value"] < 0.01 and better["mean_diff"] == pytest.approx(0.05)
    same = paired_permutation_test(
        base + rng.normal(0, 0.1, 400), base + rng.normal(0, 0.1, 400), resamples=2000
    )
    assert same["p_value"] > 0.01
    assert user_metric_vector([[1, 2], [3, 4]], [[2], [9]], "hr@2").tolist() == [1.0, 0.0]


@pytest.mark.parametrize("t", [-7.5, -1.3, -0.2, 0.0, 0.4, 2.9, 12.0])
def test_student_t_cdf_matches_closed_forms(t):
    from genrec.workloads.metrics import student_t_cdf

    assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-7)  # Cauchy
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-7)


def test_paired_t_test_less_direction_and_degenerate_cases():
    from genrec.workloads.metrics import paired_t_test_less

    lower = paired_t_test_less([0.10, 0.11, 0.09], [0.20, 0.22, 0.21])
    assert lower["mean_diff"] < 0 and lower["p_value"] < 0.05 and lower["df"] == 2
    higher = paired_t_test_less([0.20, 0.22, 0.21], [0.10, 0.11, 0.09])
    assert higher["p_value"] > 0.95
    d = [0.01, 0.03, -0.02]  # t = mean / (sd / sqrt(3)) by hand
    t = (sum(d) / 3) / (statistics.stdev(d) / math.sqrt(3))
    assert paired_t_test_less(d, [0, 0, 0])["t"] == pytest.approx(t)
    assert paired_t_test_less([1, 1], [1, 1])["p_value"] == 1.0
    with pytest.raises(ValueError):
        paired_t_test_less([1.0], [2.0])
