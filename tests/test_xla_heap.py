"""The best-fit heap XLA's buffer assignment packs temporaries into (rematopt.xla.heap): a packing is
valid (buffers live together never share bytes, offsets aligned, colocated buffers at one offset),
never below the live peak, and leaves the gaps a best-fit-decreasing order leaves."""

from __future__ import annotations

import random

import pytest

from rematopt.xla.heap import Interval, best_fit, best_packing, live_peak, pack


def test_best_fit_leaves_gaps():
    """Worked by hand: a 3-byte buffer at t=0 and another at t=5, a 1-byte buffer over t=0..4 and
    another over t=4..5. Largest first puts both 3-byte buffers at 0, the long 1-byte one above
    them (3) and the short one above that (4): a 5-byte heap, where at most 4 bytes are live
    together and 4 suffice (the long 1-byte buffer at 0, the t=0 one at 1, the t=5 one at 0, the
    short 1-byte one at 3). Longest first does no better: the long one at 0, the short one at 1,
    the t=5 buffer past it at 2."""
    intervals = [Interval(0, 1, 4, 5), Interval(1, 1, 0, 4), Interval(2, 3, 5, 5), Interval(3, 3, 0, 0)]
    spatial = pack(intervals, 1, "spatial")
    assert spatial.offsets == {2: 0, 3: 0, 1: 3, 0: 4}
    assert spatial.heap_bytes == 5
    assert pack(intervals, 1, "temporal").heap_bytes == 5
    assert best_packing(intervals, 1).heap_bytes == 5
    assert live_peak(intervals) == 4


def test_alignment_rounds_offsets_not_sizes():
    """Two 100-byte buffers live together, 64-byte alignment: the second starts at 128 and the heap
    ends where it does, at 228."""
    packing = best_packing([Interval(0, 100, 0, 3), Interval(1, 100, 2, 5)], 64)
    assert sorted(packing.offsets.values()) == [0, 128]
    assert packing.heap_bytes == 228 and packing.live_peak == 200


def test_smallest_gap_that_fits():
    """Bytes 3-6 and 11-20 in use: free are a 3-byte gap at 0 and a 5-byte gap at 6. Best fit takes
    the smallest gap that holds the buffer at its first aligned offset, else the end."""
    used = [(3, 6), (11, 20)]
    assert best_fit(used, 3, 3, 1) == 0  # both gaps hold it: the smaller, at 0
    assert best_fit(used, 4, 4, 1) == 6  # only the 5-byte gap does
    assert best_fit(used, 6, 6, 1) == 20  # neither: past the end
    assert best_fit(used, 4, 4, 4) == 20  # aligned to 4 the 5-byte gap starts at 8 and holds 3
    assert best_fit(used, 2, 5, 1) == 6  # a colocated member needs 5: the gap must hold the largest
    assert best_fit([(0, 10), (5, 30)], 1, 1, 1) == 30  # overlapping used ranges merge


@pytest.mark.parametrize("seed", range(5))
def test_random_packings_are_valid(seed):
    rng = random.Random(seed)
    intervals = []
    for k in range(40):
        start = rng.randrange(60)
        intervals.append([k, rng.choice([4, 64, 100, 256, 1000, 4096]), start, start + rng.randrange(15), [], True])
    for k in range(0, 40, 8):  # colocated pairs (one size, as XLA sizes them): the second starts where the first ends
        first, second = intervals[k], intervals[k + 1]
        second[1] = first[1]
        second[2] = first[3] + 1
        second[3] = max(second[3], second[2])
        second[5] = False
        first[4].append(k + 1)
    intervals = [Interval(k, size, s, e, tuple(c), placed) for k, size, s, e, c, placed in intervals]
    packing = best_packing(intervals, 64)
    assert packing.heap_bytes >= packing.live_peak
    assert all(off % 64 == 0 for off in packing.offsets.values())
    for k in range(0, 40, 8):
        assert packing.offsets[k] == packing.offsets[k + 1]
    for i, a in enumerate(intervals):
        for j, b in enumerate(intervals[:i]):
            if a.start <= b.end and b.start <= a.end:
                lo_a, lo_b = packing.offsets[i], packing.offsets[j]
                assert lo_a + a.size <= lo_b or lo_b + b.size <= lo_a, (a, b)
    assert packing.heap_bytes == max(packing.offsets[i] + iv.size for i, iv in enumerate(intervals))
