"""SID codec: token ranges, mixed-radix keys (a bijection on [0, prod T)), collision resolution."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.sid_codec import SIDCodec, codebook_utilisation, ensure_unique_sids, resolve_collisions

sizes_st = st.lists(st.integers(1, 9), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st)
def test_keys_are_a_bijection_onto_the_sid_space(sizes):
    codec = SIDCodec(tuple(sizes))
    keys = np.arange(codec.num_sids)
    codes = codec.keys_to_codes(keys)
    assert np.array_equal(codec.codes_to_keys(codes), keys)
    assert len({tuple(c) for c in codes.tolist()}) == codec.num_sids
    # keys sort SIDs lexicographically
    assert codes.tolist() == sorted(codes.tolist())


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st, data=st.data())
def test_tokens_round_trip_and_levels_do_not_overlap(sizes, data):
    codec = SIDCodec(tuple(sizes))
    codes = np.array([[data.draw(st.integers(0, t - 1)) for t in sizes] for _ in range(5)])
    tokens = codec.codes_to_tokens(codes)
    assert np.array_equal(codec.tokens_to_codes(tokens), codes)
    for level in range(codec.levels):
        lo, hi = codec.level_range(level)
        assert (tokens[:, level] >= lo).all() and (tokens[:, level] < hi).all()
    ranges = [codec.level_range(l) for l in range(codec.levels)]
    assert ranges[0][0] == codec.num_special and ranges[-1][1] == codec.vocab_size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_validate_codes_names_the_problem():
    codec = SIDCodec((4, 4))
    with pytest.raises(ValueError, match=r"row 1 level 1 has code 4"):
        codec.validate_codes(np.array([[0, 0], [1, 4]]))
    with pytest.raises(ValueError, match=r"shape \[N, 2\]"):
        codec.validate_codes(np.array([[0, 0, 0]]))
    with pytest.raises(ValueError, match="overflow"):
        SIDCodec((2**32, 2**32))


def test_collisions_get_a_disambiguation_level_in_input_order():
    codes = np.array([[1, 2], [0, 0], [1, 2], [1, 2]])
    out, stats = resolve_collisions(codes)
    assert out[:, 2].tolist() == [0, 0, 1, 2]
    assert stats["colliding_items"] == 3 and stats["max_group_size"] == 3
    fixed, sizes, stats = ensure_unique_sids(codes, (2, 3))
    assert sizes == (2, 3, 3) and len({tuple(r) for r in fixed.tolist()}) == 4
    same, sizes, stats = ensure_unique_sids(np.array([[0, 1], [1, 0]]), (2, 2))
    assert sizes == (2, 2) and not stats["disambiguation_level"]


def test_utilisation():
    assert codebook_utilisation(np.array([[0, 1], [0, 2]]), (4, 4)) == [0.25, 0.5]
    assert math.isclose(sum(codebook_utilisation(np.array([[0], [1]]), (2,))), 1.0)
