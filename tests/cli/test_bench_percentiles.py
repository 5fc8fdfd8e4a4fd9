"""tsctl bench's p50/p90/p99: linear interpolation between the nearest sorted latencies (statistics.quantiles,
method "inclusive"), the percentile numpy and spreadsheets compute by default."""

import math
import random
from collections import Counter

import numpy as np
import pytest

from archiver.capacity.bench import LoadResult


def result(latencies):
    return LoadResult(seconds=1.0, latencies_ms=list(latencies), statuses=Counter({200: len(latencies)}))


def test_known_values():
    latencies = list(range(1, 11))
    random.Random(0).shuffle(latencies)
    ten = result(latencies)
    assert (ten.percentile(50), ten.percentile(90), ten.percentile(99)) == pytest.approx((5.5, 9.1, 9.91))
    assert ten.summary()["latency_ms"] == {"p50": 5.5, "p90": 9.1, "p99": 9.91, "mean": 5.5}
    two = result([10.0, 20.0])
    assert (two.percentile(50), two.percentile(90), two.percentile(99)) == pytest.approx((15.0, 19.0, 19.9))


def test_the_same_as_numpys_default_percentile():
    rng = random.Random(1)
    for size in (2, 3, 7, 100, 1001):
        latencies = [rng.lognormvariate(3, 0.5) for _ in range(size)]
        for p in (50, 90, 99):
            assert result(latencies).percentile(p) == pytest.approx(np.percentile(latencies, p)), (size, p)


def test_one_latency_is_every_percentile_and_none_is_nan():
    assert result([12.5]).summary()["latency_ms"] == {"p50": 12.5, "p90": 12.5, "p99": 12.5, "mean": 12.5}
    assert math.isnan(result([]).percentile(50))
    assert result([]).summary()["latency_ms"]["mean"] is None


def test_the_line_bench_prints_names_the_failed_statuses_and_no_nan():
    """Every request refused printed 'p50 nan ms, p90 nan ms, p99 nan ms, 4 errors' without a status."""
    from archiver.capacity.bench import summary_line

    refused = LoadResult(seconds=0.5, statuses=Counter({400: 4}))
    line = summary_line(refused.summary())
    assert line == "4 requests in 0.5s: 8.0 req/s, 4 errors (4 answered 400): none answered 200", line
    mixed = LoadResult(seconds=1.0, latencies_ms=[10.0, 20.0], statuses=Counter({200: 2, 503: 1}))
    assert summary_line(mixed.summary()).endswith("p99 19.9 ms, 1 errors (1 answered 503)")
