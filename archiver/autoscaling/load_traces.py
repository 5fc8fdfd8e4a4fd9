"""The load traces ``tsctl simulate --trace`` replays (autoscale_sim.py): each a function of time giving the
offered requests a second, in multiples of one replica's throughput ``one``, with its ``duration``."""

import math
from typing import Callable

from .. import choices


def ramp(
    one: float, peak: float = 50, base: float = 0.5, up_s: float = 600, hold_s: float = 300, down_s: float = 300
) -> Callable[[float], float]:
    """From ``base`` x one replica's throughput ``one`` up to ``peak`` x over ``up_s``, held, then down."""

    def rate(t: float) -> float:
        if t < up_s:
            return one * (base + (peak - base) * t / up_s)
        if t < up_s + hold_s:
            return one * peak
        return one * max(base, peak - (peak - base) * (t - up_s - hold_s) / down_s)

    rate.duration = up_s + hold_s + down_s + 120
    return rate


def spike(one: float, base: float = 5, peak: float = 30, at_s: float = 240, for_s: float = 60):
    """``base`` x one replica's throughput, ``peak`` x for ``for_s`` seconds from ``at_s``, then back."""

    def rate(t: float) -> float:
        return one * (peak if at_s <= t < at_s + for_s else base)

    rate.duration = at_s + for_s + 480
    return rate


def diurnal(one: float, low: float = 2, peak: float = 50, day_s: float = 7200):
    """A day compressed into ``day_s`` seconds: ``low`` x one replica's throughput at 4 am rising to
    ``peak`` x at 4 pm (a cosine); the autoscalers' clocks are not compressed, so changes come 86400/day_s
    times faster than in a real day."""

    def rate(t: float) -> float:
        hour = (t / day_s * 24) % 24
        return one * (low + (peak - low) * (1 - math.cos(2 * math.pi * (hour - 4) / 24)) / 2)

    rate.duration = day_s
    return rate


TRACES = {"ramp": ramp, "spike": spike, "diurnal": diurnal}
assert tuple(TRACES) == choices.SIMULATED_TRACES
