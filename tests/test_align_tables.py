"""AtSpeed's alignment pieces through the codec's token table (issue 32): the level of a token, the
token-level KD losses and the constrained-vocabulary mask give, on a vocabulary whose SID ids are
scattered (an imported LC-Rec-style table), exactly what they give on our level-offset layout with the
logits permuted alike; a code without a token takes no part."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from genrec.workloads.decoding.prefix_keys import PrefixKeySets
from genrec.workloads.sid_codec import SIDCodec
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.training.align_sequences import context_valid_mask
from genrec.workloads.training.align_token_level import token_levels, tvdkd_loss, wordkd_loss

OURS = SIDCodec((4, 3, 5))


def scattered(seed: int) -> tuple[SIDCodec, np.ndarray]:
    """A table codec whose (level, code) token is perm[our id], and perm (a permutation of the ids)."""
    perm = np.random.default_rng(seed).permutation(OURS.vocab_size)
    ids = tuple(tuple(int(perm[t]) for t in OURS.level_token_ids(l)) for l in range(OURS.levels))
    return SIDCodec.from_table(SIDTokenTable(ids, OURS.vocab_size)), perm


def permuted(logits: torch.Tensor, perm: np.ndarray) -> torch.Tensor:
    out = torch.empty_like(logits)
    out[:, torch.as_tensor(perm)] = logits  # the table's id perm[t] scores what our id t scores
    return out


@pytest.mark.parametrize("seed", range(4))
def test_token_levels_and_kd_losses_equal_ours_on_a_scattered_table(seed):
    table, perm = scattered(seed)
    assert any(table.table.contiguous_range(l) is None for l in range(table.levels))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(np.concatenate([OURS.level_token_ids(l)[:2] for l in range(OURS.levels)]))
    draft, target = (torch.randn(len(labels), OURS.vocab_size, generator=gen) for _ in range(2))
    levels = token_levels(labels, OURS)
    assert torch.equal(token_levels(torch.as_tensor(perm)[labels], table), levels)
    assert token_levels(torch.tensor([-100, 0]), table).tolist() == [-1, int(table.level_of_token(0))]
    for loss in (wordkd_loss, tvdkd_loss):
        want = loss(draft, target, levels, OURS)
        got = loss(permuted(draft, perm), permuted(target, perm), levels, table)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_context_valid_mask_equals_ours_on_a_scattered_table(seed):
    table, perm = scattered(seed)
    rng = np.random.default_rng(seed)
    keys = torch.as_tensor(np.sort(rng.choice(OURS.num_sids, size=12, replace=False)))
    items = OURS.keys_to_codes(keys)
    prefix = torch.as_tensor(items[rng.integers(0, len(items), size=(2, 6))])  # [B, C, L]
    tree = SimpleNamespace(prefix=prefix, length=torch.as_tensor(rng.integers(0, OURS.levels, size=(2, 6))))
    want = context_valid_mask(tree, OURS, PrefixKeySets(OURS, keys))
    got = context_valid_mask(tree, table, PrefixKeySets(table, keys))
    assert torch.equal(got[..., torch.as_tensor(perm)], want)


def test_a_code_without_a_token_is_never_a_valid_child():
    ids = ((5, -1, 6), (7, 8))  # level 0 code 1 has no token
    codec = SIDCodec.from_table(SIDTokenTable(ids, 10))
    keys = torch.tensor([0, 1, 2, 3, 4, 5])  # every SID, the gap's included
    tree = SimpleNamespace(
        prefix=torch.zeros(1, 1, 2, dtype=torch.long), length=torch.zeros(1, 1, dtype=torch.long)
    )
    mask = context_valid_mask(tree, codec, PrefixKeySets(codec, keys))
    assert mask[0, 0].nonzero().flatten().tolist() == [5, 6]
