"""The codec's model-feeding token lookups on a token table (a decided prefix, one level's codes) agree
with the whole-SID lookup, keep our level-offset arithmetic bit for bit, and feed a dead beam's gap code
as id 0."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.sid_table import NO_TOKEN, SIDTokenTable


@st.composite
def tables(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    extra = draw(st.integers(0, 5))
    n = sum(sizes)
    perm = draw(st.permutations(range(extra, extra + n)))  # any id order: levels interleave
    gaps = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ids, k = [], 0
    for t in sizes:
        row = [NO_TOKEN if gaps[k + c] and c else perm[k + c] for c in range(t)]  # code 0 never a gap
        ids.append(tuple(row))
        k += t
    return SIDTokenTable(tuple(ids), extra + n)


@settings(max_examples=60, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_prefix_and_level_tokens_agree_with_whole_sid_lookup(table, seed):
    codec = SIDCodec.from_table(table)
    rng = np.random.default_rng(seed)
    codes = torch.as_tensor(np.stack([rng.integers(0, t, size=(3, 2)) for t in table.codebook_sizes], -1))
    whole = torch.as_tensor(codec.codes_to_tokens(codes))
    for t in range(1, table.levels + 1):
        assert torch.equal(codec.prefix_to_tokens(codes[..., :t]), whole[..., :t].clamp(min=0))
    for level in range(table.levels):
        assert torch.equal(codec.level_tokens(level, codes[..., level]), whole[..., level].clamp(min=0))
        ids = codec.level_ids_tensor(level, "cpu")
        assert torch.equal(ids, torch.as_tensor(table.level_token_ids(level)))
        assert codec.level_ids_tensor(level, "cpu") is ids  # kept, not rebuilt per step


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_level_offset_lookups_are_the_offset_arithmetic(sizes, seed):
    codec = SIDCodec(tuple(sizes))
    rng = np.random.default_rng(seed)
    codes = torch.as_tensor(np.stack([rng.integers(0, t, size=4) for t in sizes], -1))
    offsets = torch.as_tensor(codec.offsets())
    assert torch.equal(codec.prefix_to_tokens(codes), codes + offsets)
    for level in range(len(sizes)):
        assert torch.equal(codec.level_tokens(level, codes[:, level]), codes[:, level] + offsets[level])
