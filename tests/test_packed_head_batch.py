"""Packed draft-head training: each placeholder block sees exactly its own prompt.

The fast path (one sequence per training window, training/packed_head_batch.py) is checked against
the slow, obvious one: one prompt per (history, target), built by build_prompts + append_placeholders.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.workloads.errors import UserInputError
from genrec.workloads.models.inputs import build_prompts, item_token_table, training_windows
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.nezha_head import append_placeholders
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, PAD, SIDCodec
from genrec.workloads.training.nezha_objective import HeadObjective, head_examples
from genrec.workloads.training.packed_head_batch import build_packed_head_batch, window_targets
from genrec.workloads.training.train_config import TrainConfig

SIZES = (4, 3, 5)
CODEC = SIDCodec(SIZES)
PLACEHOLDERS = [CODEC.placeholder_token(l) for l in range(CODEC.levels)]


def catalogue(n_items: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = rng.choice(int(np.prod(SIZES)), size=n_items, replace=False)
    return np.asarray(CODEC.keys_to_codes(keys))


def backbone(seed: int) -> GRTransformer:
    torch.manual_seed(seed)
    return GRTransformer(ModelConfig(vocab_size=CODEC.vocab_size, dim=16, n_layers=2, n_heads=2)).eval()


def per_example_states(model, item_tokens, pairs, placeholders):
    """The reference: one left-padded prompt per (history, target), as the per-example objective."""
    tokens, mask = build_prompts([h for h, _ in pairs], item_tokens, max_items=10**6)
    if placeholders:
        tokens, mask = append_placeholders(tokens, mask, placeholders)
    hidden = model.hidden_states(tokens, mask)
    return hidden[:, -(len(placeholders) + 1) :] if placeholders else hidden[:, -1:]


windows_strategy = st.lists(
    st.lists(st.integers(0, 29), min_size=2, max_size=7).flatmap(
        lambda w: st.tuples(st.just(w), st.integers(1, len(w) - 1))
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=30, deadline=None)
@given(windows=windows_strategy, with_placeholders=st.booleans(), seed=st.integers(0, 3))
def test_packed_states_equal_one_prompt_per_target(windows, with_placeholders, seed):
    item_tokens = item_token_table(CODEC, catalogue(30, seed))
    model = backbone(seed)
    placeholders = PLACEHOLDERS if with_placeholders else None
    batch = build_packed_head_batch(windows, item_tokens, placeholders)
    pairs = [p for w, n in windows for p in window_targets(w, n)]
    assert batch.targets.tolist() == [t for _, t in pairs]
    with torch.no_grad():
        hidden = model.hidden_states(batch.tokens, positions=batch.positions, attn_mask=batch.attn_mask)
        packed = batch.head_states(hidden)
        reference = per_example_states(model, item_tokens, pairs, placeholders or [])
    assert packed.shape == reference.shape == (len(pairs), CODEC.levels + 1 if placeholders else 1, 16)
    torch.testing.assert_close(packed, reference, atol=2e-5, rtol=1e-4)


def test_packed_layout_of_one_window_by_hand():
    # items 0, 1, 2 with one-token "SIDs" (L = 1): history [BOS, t0, t1]; targets items 1 and 2
    item_tokens = np.array([[10], [11], [12]])
    batch = build_packed_head_batch([([0, 1, 2], 2)], item_tokens, [99])
    assert batch.tokens.tolist() == [[BOS, 10, 11, 99, 99]]
    assert batch.positions.tolist() == [[0, 1, 2, 2, 3]]  # each block continues its own history
    expected = [
        [1, 0, 0, 0, 0],  # BOS
        [1, 1, 0, 0, 0],  # t0
        [1, 1, 1, 0, 0],  # t1: never sees a placeholder
        [1, 1, 0, 1, 0],  # <SP> for target item 1: history [BOS, t0]
        [1, 1, 1, 0, 1],  # <SP> for target item 2: history [BOS, t0, t1], not the other block
    ]
    assert batch.attn_mask[0].int().tolist() == expected
    assert batch.state_index.tolist() == [[1, 3], [2, 4]]  # (h_0, h_1) per target
    assert batch.targets.tolist() == [1, 2]


def test_packed_rows_are_left_padded_and_pads_see_only_themselves():
    item_tokens = np.array([[10], [11], [12]])
    batch = build_packed_head_batch([([0, 1, 2], 2), ([2, 0], 1)], item_tokens, [99])
    # the short row [BOS, t2, <SP>] is padded on the left by two
    assert batch.tokens[1].tolist() == [PAD, PAD, BOS, 12, 99]
    assert batch.attn_mask[1, :2].int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0]]
    assert batch.state_index.tolist() == [[1, 3], [2, 4], [5 + 3, 5 + 4]]
    with pytest.raises(ValueError, match="3 targets impossible for 3 items"):
        build_packed_head_batch([([0, 1, 2], 3)], item_tokens, [99])
    # a packed row may be longer than max_seq_len as long as its positions fit
    torch.manual_seed(0)
    model = GRTransformer(ModelConfig(vocab_size=100, dim=8, n_layers=1, n_heads=2, max_seq_len=4))
    long = build_packed_head_batch([([0, 1, 2], 2)], item_tokens, [99])  # 5 tokens, positions 0..3
    assert model.hidden_states(long.tokens, positions=long.positions, attn_mask=long.attn_mask).shape[1] == 5
    with pytest.raises(ValueError, match="position 4 is beyond max_seq_len 4"):
        model.hidden_states(long.tokens, positions=long.positions + 1, attn_mask=long.attn_mask)
    with pytest.raises(ValueError, match="together"):
        model.hidden_states(long.tokens, positions=long.positions)


@pytest.mark.parametrize("kind,variant", [("nezha", "full"), ("nezha", "no_placeholder"), ("mtp", "full")])
def test_packed_loss_equals_the_per_example_loss_on_the_same_targets(kind, variant):
    items = catalogue(30, seed=7)
    item_tokens = item_token_table(CODEC, items)
    rng = np.random.default_rng(8)
    sequences = [list(rng.integers(0, 30, size=rng.integers(2, 12))) for _ in range(9)]
    model = backbone(9)
    objective = HeadObjective(
        kind, variant, model, CODEC, item_tokens, items, sequences, [[0, 1]], max_items=4,
        device=torch.device("cpu"), autocast=False,
    )  # fmt: skip
    windows = training_windows(sequences, 4)
    assert objective.lengths() == [len(w) for w, _ in windows]  # one unit per next-item window
    with torch.no_grad():
        packed = objective.packed_level_losses(windows)
        reference = objective.level_losses([p for w, n in windows for p in window_targets(w, n)])
    torch.testing.assert_close(packed, reference, atol=1e-5, rtol=1e-5)
    # both ways cover every target once: the windows' targets are the per-example targets
    assert sorted(t for w, n in windows for _, t in window_targets(w, n)) == sorted(
        t for _, t in head_examples(sequences, 4)
    )


def test_per_example_batching_is_still_available_and_bad_names_are_refused():
    items = catalogue(30, seed=1)
    sequences = [[0, 1, 2, 3], [4, 5, 6]]
    objective = HeadObjective(
        "nezha", "full", backbone(0), CODEC, item_token_table(CODEC, items), items, sequences, [[0, 1]],
        max_items=4, device=torch.device("cpu"), autocast=False, batching="per_example",
    )  # fmt: skip
    assert objective.lengths() == [1, 2, 3, 1, 2]  # one unit per target: its history length
    with pytest.raises(UserInputError, match="head_batching must be one of"):
        TrainConfig(objective="nezha", head_batching="bucketed").validate()
