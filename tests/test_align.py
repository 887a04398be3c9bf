"""AtSpeed draft alignment: every objective against a slow per-sequence reference, the alpha mixture,
the ablation flags, the teacher file (row i = the target's output for example i) and the CLI."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_cli

from genrec.workloads.decoding.base import get_decoder, make_params
from genrec.workloads.errors import UserInputError
from genrec.workloads.evaluation import load_context
from genrec.workloads.models.checkpoint import load_checkpoint
from genrec.workloads.models.inputs import build_training_batch, item_token_table, training_windows
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import BOS, SIDCodec
from genrec.workloads.training.align import AlignFlags, AlignObjective, mix_losses
from genrec.workloads.training.align_context_tree import teacher_forced_log_probs
from genrec.workloads.training.align_sequence_level import (
    atspeed_s_terms,
    negative_entropy_on_support,
    reverse_kl_on_support,
    support_log_probs,
)
from genrec.workloads.training.teacher import (
    TeacherData,
    build_teacher_data,
    check_teacher_matches,
    load_teacher,
    teacher_examples,
)
from genrec.workloads.training.train_config import TrainConfig
from genrec.workloads.training.trainer import target_loss, train

SIZES = (4, 3, 5)
K = 3


# --- a tiny random world: codec, catalogue, two models, examples with teacher SIDs ------------------
def random_model(vocab: int, dim: int, layers: int, seed: int) -> GRTransformer:
    torch.manual_seed(seed)
    model = GRTransformer(ModelConfig(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=2, max_seq_len=64))
    with torch.no_grad():  # spread-out distributions (the init's are almost uniform)
        model.lm_head.weight.normal_(0, 0.5)
        model.embed_tokens.weight.normal_(0, 1.0)
    return model.eval()


class World:
    def __init__(self, seed: int = 0, batch: int = 4) -> None:
        rng = np.random.default_rng(seed)
        self.codec = SIDCodec(SIZES)
        keys = rng.choice(self.codec.num_sids, size=20, replace=False)  # 20 of 60 SIDs are items
        self.item_codes = np.asarray(self.codec.keys_to_codes(np.sort(keys)))
        self.item_tokens = item_token_table(self.codec, self.item_codes)
        vocab = self.codec.vocab_size
        self.draft = random_model(vocab, 16, 1, seed + 1)
        self.target = random_model(vocab, 32, 2, seed + 2)
        n = len(self.item_codes)
        self.prompts = [list(rng.integers(0, n, size=int(rng.integers(1, 5)))) for _ in range(batch)]
        self.targets = [int(rng.integers(0, n)) for _ in range(batch)]
        # K distinct teacher items per example (any order: the losses are defined for any SID set)
        items = np.stack([rng.choice(n, size=K, replace=False) for _ in range(batch)])
        self.codes = self.item_codes[items]  # [B, K, L]
        self.windows = [(p + [t], len(p)) for p, t in zip(self.prompts, self.targets)]
        self.teacher = TeacherData(
            path=None,
            manifest={"kind": "beam", "k": K},
            user_id=np.arange(batch),
            prompts=self.prompts,
            target_item=np.asarray(self.targets),
            codes=self.codes,
            logprobs=np.zeros((batch, K)),
        )

    def objective(self, kind: str, alpha: float = 1.0, **flags) -> AlignObjective:
        return AlignObjective(
            kind, alpha, AlignFlags(**flags), self.draft, self.target, self.teacher, self.codec,
            self.item_tokens, self.item_codes, self.windows, 8, torch.device("cpu"), False,
        )  # fmt: skip

    def valid_prefixes(self) -> set[tuple[int, ...]]:
        return {tuple(c[:t]) for c in self.item_codes.tolist() for t in range(len(SIZES) + 1)}


@pytest.fixture(scope="module")
def world():
    return World()


# --- slow references: one sequence at a time, explicit probabilities -------------------------------
def softmax(row: list[float]) -> list[float]:
    m = max(row)
    e = [math.exp(x - m) for x in row]
    z = sum(e)
    return [x / z for x in e]


@torch.no_grad()
def plain_rows(model, item_tokens, prompt, sid_tokens) -> list[list[float]]:
    """Logit rows predicting each SID token, from a plain causal forward of [BOS] prompt SID."""
    tokens = [BOS] + item_tokens[prompt].reshape(-1).tolist() + list(sid_tokens)
    logits = model(torch.tensor([tokens]))[0][0]
    p = len(tokens) - len(sid_tokens)
    return [logits[p - 1 + t].tolist() for t in range(len(sid_tokens))]


def reference_sequence_loss(
    w: World, kind: str, n_align=K, constrained=True, density_reg=True, dr_mode="weighted"
) -> float:
    codec, levels, vocab = w.codec, len(SIZES), w.codec.vocab_size
    valid = w.valid_prefixes()
    per_example = []
    for b, prompt in enumerate(w.prompts):
        toks = [codec.codes_to_tokens(np.asarray(c)).tolist() for c in w.codes[b].tolist()]
        q_rows = [plain_rows(w.draft, w.item_tokens, prompt, s) for s in toks]
        p_rows = [plain_rows(w.target, w.item_tokens, prompt, s) for s in toks]
        # the target's own conditional of the K-th SID's t-th token: p(y_{K,t} | y_{K,<t})
        p_k = [softmax(p_rows[K - 1][t])[toks[K - 1][t]] for t in range(levels)]
        terms = []
        for k in range(n_align):
            per_level = []
            for t in range(levels):
                q, p = softmax(q_rows[k][t]), softmax(p_rows[k][t])
                if kind == "seqkd":
                    per_level.append(-math.log(q[toks[k][t]]))
                    continue
                if constrained:
                    lo = codec.level_offset(t)
                    prefix = tuple(w.codes[b, k, :t].tolist())
                    ok = [lo + c for c in range(SIZES[t]) if prefix + (c,) in valid]
                    support = sorted(ok, key=lambda v: -q[v])[:K]
                else:
                    support = list(range(vocab))
                zq, zp = sum(q[v] for v in support), sum(p[v] for v in support)
                qn = {v: q[v] / zq for v in support}
                pn = {v: p[v] / zp for v in support}
                if kind == "atspeed_r":
                    per_level.append(0.5 * sum(abs(pn[v] - qn[v]) for v in support))
                    continue
                rkld = sum(qn[v] * math.log(qn[v] / pn[v]) for v in support)
                if dr_mode == "literal":  # eq. 4 as printed
                    dr = sum(qn[v] * math.log(qn[v] / p_k[t]) for v in support)
                else:  # p(y_K) weighting the draft's negative entropy on V_c
                    dr = p_k[t] * sum(qn[v] * math.log(qn[v]) for v in support)
                per_level.append(rkld - (dr if density_reg else 0.0))
            terms.append(per_level)
        if kind == "seqkd":  # mean over every (SID, level)
            per_example.append(sum(map(sum, terms)) / (n_align * levels))
        else:  # eq. 4 (read as a mean over the SIDs) and eq. 8: mean over (x, y) pairs
            per_example.append(sum(sum(x) / levels for x in terms) / n_align)
    return sum(per_example) / len(per_example)


def reference_token_loss(w: World, kind: str) -> float:
    """WordKD / TVDKD over every target SID token of the windows, level-restricted softmaxes."""
    codec, levels = w.codec, len(SIZES)
    values = []
    for window, n_targets in w.windows:
        tokens = [BOS] + w.item_tokens[window].reshape(-1).tolist()
        with torch.no_grad():
            q_logits = w.draft(torch.tensor([tokens]))[0][0]
            p_logits = w.target(torch.tensor([tokens]))[0][0]
        for j in range(len(window) - n_targets, len(window)):
            for t in range(levels):
                pos = 1 + levels * j + t  # this token is predicted from position pos - 1
                q, p = softmax(q_logits[pos - 1].tolist()), softmax(p_logits[pos - 1].tolist())
                lo, hi = codec.level_range(t)
                if kind == "wordkd":
                    values.append(sum(p[v] * math.log(p[v] / q[v]) for v in range(lo, hi)))
                else:
                    values.append(0.5 * sum(abs(p[v] - q[v]) for v in range(lo, hi)))
    return sum(values) / len(values)


def sft_loss(w: World) -> torch.Tensor:
    tok, mask, lab = build_training_batch([x for x, _ in w.windows], w.item_tokens, [n for _, n in w.windows])
    return target_loss(w.draft, tok, mask, lab, torch.device("cpu"), False)


BATCH = np.arange(4)


# --- each objective equals its reference ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["seqkd", "atspeed_s", "atspeed_r"])
def test_sequence_objectives_equal_the_per_sequence_reference(world, kind):
    got = world.objective(kind).loss(BATCH).item()
    assert got == pytest.approx(reference_sequence_loss(world, kind), rel=5e-6, abs=1e-7)


@pytest.mark.parametrize("kind", ["wordkd", "tvdkd"])
def test_token_objectives_equal_the_per_position_reference(world, kind):
    got = world.objective(kind).loss(BATCH).item()
    assert got == pytest.approx(reference_token_loss(world, kind), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "kind, flags, ref",
    [
        ("atspeed_s", {"density_reg": False}, {"density_reg": False}),
        ("atspeed_s", {"dr_mode": "literal"}, {"dr_mode": "literal"}),
        ("atspeed_s", {"constrained": False}, {"constrained": False}),
        ("atspeed_s", {"top1": True}, {"n_align": 1}),
        ("atspeed_r", {"constrained": False}, {"constrained": False}),
        ("atspeed_r", {"top1": True}, {"n_align": 1}),
        ("seqkd", {"top1": True}, {"n_align": 1}),
    ],
)
def test_ablation_flags_change_exactly_what_they_name(world, kind, flags, ref):
    full = world.objective(kind).loss(BATCH).item()
    ablated = world.objective(kind, **flags).loss(BATCH).item()
    assert ablated == pytest.approx(reference_sequence_loss(world, kind, **ref), rel=1e-4, abs=1e-6)
    assert abs(ablated - full) > 1e-4


def test_constraint_and_top_k_both_cut_the_support_in_this_world(world):
    # so the references above exercise both: some teacher step has fewer valid children than its
    # level has codes (the constraint bites) and some has more than K (the top-K cut bites)
    valid = world.valid_prefixes()
    steps = [
        (t, tuple(c[:t])) for c in world.codes.reshape(-1, len(SIZES)).tolist() for t in range(len(SIZES))
    ]
    counts = [(t, sum(prefix + (v,) in valid for v in range(SIZES[t]))) for t, prefix in steps]
    assert any(n < SIZES[t] for t, n in counts) and any(n > K for _, n in counts)


# --- AtSpeed-S's reading of eq. 4 (docs/results.md, "AtSpeed-S objective re-check") ----------------
def one_level(draft: list[float], target: list[float], support: list[bool], sid_token: int):
    """level_loss's inputs for one context: draft and target logits, y_K's token (the only SID), V_c."""
    q = torch.tensor(draft, dtype=torch.float64).requires_grad_(True)
    p = torch.tensor(target, dtype=torch.float64)
    return q, p, sid_token, torch.tensor(support)


def level_loss(q, p, sid_token: int, support, density_reg: bool = True, dr_mode: str = "weighted"):
    """AtSpeed-S's term at one context, composed from the production pieces as align_sequences does."""
    lq, lq0 = support_log_probs(q, support)
    _, lp0 = support_log_probs(p, support)
    log_w = torch.log_softmax(p.float(), -1)[sid_token]  # p(y_K,t): the full-vocabulary conditional
    rkld, neg_entropy = reverse_kl_on_support(lq, lq0, lp0), negative_entropy_on_support(lq, lq0)
    return atspeed_s_terms(rkld, neg_entropy, log_w, density_reg, dr_mode)


@pytest.mark.parametrize(
    "dr_mode, value, grad0",
    [
        # hand computation (q' = (0.9, 0.1), p' = (0.6, 0.4), w = p(y_K,t) = 0.5):
        # KL(q'||p') = 0.9 ln 1.5 + 0.1 ln 0.25 = 0.226289, H(q') = 0.325083
        # weighted: KL + w H = 0.388831; d/dz_0 = q_0 (g_0 - sum q g), g = (1-w)(ln q + 1) - ln p'
        #           = 0.9 * (0.958146 - 0.888831) = +0.062384: q'_0 is above the optimum
        #           p'^2 / sum p'^2 = (0.692, 0.308), so the loss pulls it back
        # literal:  -sum q' ln p' + ln w = 0.551372 - 0.693147 = -0.141775; d/dz_0 = 0.9 * (-ln 0.6
        #           - 0.551372) = -0.036491: it pushes q' further towards the one-hot
        ("weighted", 0.388831, 0.062384),
        ("literal", -0.141775, -0.036491),
    ],
)
def test_atspeed_s_on_a_hand_computed_level(dr_mode, value, grad0):
    # target over three tokens (1/2, 1/3, 1/6); the third is outside V_c, where the draft puts most of
    # its mass (an invalid code): neither its probability nor its logit may matter
    q, p, sid, support = one_level(
        [math.log(0.9), math.log(0.1), 5.0], [math.log(1 / 2), math.log(1 / 3), math.log(1 / 6)],
        [True, True, False], sid_token=0,
    )  # fmt: skip
    loss = level_loss(q, p, sid, support, dr_mode=dr_mode)
    loss.backward()
    assert loss.item() == pytest.approx(value, abs=1e-6)
    assert q.grad[0].item() == pytest.approx(grad0, abs=1e-6)
    assert q.grad[2].item() == 0.0


def random_level(seed: int, n: int = 6, cut: int = 4):
    g = torch.Generator().manual_seed(seed)
    target = (torch.randn(n, generator=g, dtype=torch.float64) * 2).tolist()
    draft = (torch.randn(n, generator=g, dtype=torch.float64) * 2).tolist()
    support = [i < cut for i in range(n)]
    # y_K's token: any but the target's favourite, so w = p(y_K,t) <= 1/2 and p'^(1/(1-w)) stays
    # representable in floating point (w -> 1 sharpens towards the one-hot; see the module doc)
    others = [i for i in range(n) if i != int(torch.tensor(target).argmax())]
    sid = others[int(torch.randint(0, len(others), (1,), generator=g))]
    return draft, target, support, sid


def support_target(target: list[float], support: list[bool]) -> torch.Tensor:
    """p' over V_c (the first entries), as float64."""
    t = torch.tensor(target, dtype=torch.float64)[torch.tensor(support)]
    return torch.softmax(t, -1)


@pytest.mark.parametrize("seed", range(8))
def test_reverse_kl_part_is_minimised_where_the_draft_matches_the_target_on_v_c(seed):
    draft, target, support, sid = random_level(seed)
    # the draft equal to the target up to a shift on V_c (anything outside): q' = p'
    matched = [t + 1.7 if s else d for d, t, s in zip(draft, target, support)]
    q, p, sid_t, sup = one_level(matched, target, support, sid)
    at_match = level_loss(q, p, sid_t, sup, density_reg=False)
    at_match.backward()
    # (the losses compute in float32, hence the tolerances)
    assert at_match.item() == pytest.approx(0.0, abs=1e-6)
    assert q.grad.abs().max().item() < 1e-6  # a stationary point ...
    q2, *_ = one_level(draft, target, support, sid)
    assert level_loss(q2, p, sid_t, sup, density_reg=False).item() > 1e-6  # ... and the minimum


@pytest.mark.parametrize("seed", range(8))
def test_weighted_atspeed_s_is_bounded_and_minimised_by_the_sharpened_target(seed):
    """KL(q'||p') + w H(q') >= 0, minimised at q' ~ p'^(1/(1-w)): the target's ranking on V_c, sharper,
    not one-hot. Eq. 4 as printed (the code before the re-check) is linear in q', goes below 0, and is
    not stationary there."""
    draft, target, support, sid = random_level(seed)
    _, p, sid_t, sup = one_level(draft, target, support, sid)
    w = torch.softmax(p, -1)[sid].item()  # p(y_K,t): the full-vocabulary conditional
    p_sup = support_target(target, support)
    best = torch.softmax(p_sup.log() / (1 - w), -1)
    at_best = [math.log(best[i]) if s else d for i, (d, s) in enumerate(zip(draft, support))]
    q, *_ = one_level(at_best, target, support, sid)
    loss = level_loss(q, p, sid_t, sup)
    loss.backward()
    assert q.grad.abs().max().item() < 1e-6 and loss.item() >= 0.0
    assert best.max().item() < 0.999  # the minimiser keeps the other codes of V_c
    for trial in range(20):  # it is the minimum: random drafts (incl. near one-hot ones) are higher
        g = torch.Generator().manual_seed(1000 * seed + trial)
        z = (torch.randn(len(draft), generator=g, dtype=torch.float64) * (1 + trial)).tolist()
        qz, *_ = one_level(z, target, support, sid)
        assert level_loss(qz, p, sid_t, sup).item() >= loss.item() - 1e-6
    one_hot = [30.0 if i == int(p_sup.argmax()) else 0.0 for i in range(len(draft))]
    q1, *_ = one_level(one_hot, target, support, sid)
    assert level_loss(q1, p, sid_t, sup).item() > loss.item() + 1e-6  # collapse is not rewarded
    q_lit, *_ = one_level(at_best, target, support, sid)
    literal = level_loss(q_lit, p, sid_t, sup, dr_mode="literal")
    literal.backward()
    assert q_lit.grad.abs().max().item() > 1e-3  # the printed form moves on from there ...
    assert level_loss(q1, p, sid_t, sup, dr_mode="literal").item() < literal.item()  # ... to collapse


def test_align_flags_refuse_an_unknown_density_reading():
    with pytest.raises(ValueError, match="dr_mode"):
        AlignFlags(dr_mode="paper")


# --- the alpha mixture -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["wordkd", "seqkd", "tvdkd", "atspeed_s", "atspeed_r"])
def test_alpha_zero_is_sft_exactly_and_alpha_is_applied(world, kind):
    sft = sft_loss(world)
    assert torch.equal(world.objective(kind, alpha=0.0).loss(BATCH), sft)  # bit for bit
    align = world.objective(kind, alpha=1.0).loss(BATCH)  # the alignment loss alone
    mixed = world.objective(kind, alpha=0.3).loss(BATCH)
    assert mixed.item() == pytest.approx(0.3 * align.item() + 0.7 * sft.item(), rel=1e-5)
    assert abs(align.item() - sft.item()) > 1e-3  # so the three checks above can tell them apart


def test_mix_losses_is_eq_5():
    rec, align = torch.tensor(2.0), torch.tensor(10.0)
    assert mix_losses(rec, align, 0.0) is rec and mix_losses(None, align, 1.0) is align
    assert mix_losses(rec, align, 0.25).item() == pytest.approx(0.25 * 10 + 0.75 * 2)
    with pytest.raises(ValueError, match="alpha"):
        mix_losses(rec, align, 1.5)


def test_losses_give_finite_gradients(world):
    for kind in ("atspeed_s", "atspeed_r", "wordkd"):
        world.draft.zero_grad()
        world.objective(kind, alpha=0.5).loss(BATCH).backward()
        grads = [p.grad for p in world.draft.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        assert all(p.grad is None for p in world.target.parameters())  # the target stays frozen
    world.draft.zero_grad()


def test_teacher_forced_log_probs_are_the_plain_rows_sums(world):
    got = teacher_forced_log_probs(world.draft, world.prompts, world.codes, world.item_tokens, world.codec, 8)
    assert got.shape == world.codes.shape[:2]
    for b, prompt in enumerate(world.prompts):
        for k in range(K):
            toks = world.codec.codes_to_tokens(world.codes[b, k]).tolist()
            rows = plain_rows(world.draft, world.item_tokens, prompt, toks)
            want = sum(math.log(softmax(r)[tok]) for r, tok in zip(rows, toks))
            assert got[b, k].item() == pytest.approx(want, abs=1e-5)


# --- teacher data ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def teacher_file(tiny_model_dir, synth_dir, tmp_path_factory):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    out = tmp_path_factory.mktemp("teacher") / "beam.parquet"
    build_teacher_data(ctx, ds, K, out, batch_size=32, target_path=tiny_model_dir, progress=False)
    return out


def test_teacher_rows_follow_the_trainer_windows(teacher_file, synth_dir, tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    teacher = load_teacher(teacher_file)
    windows = training_windows(list(ds.user_sequences(("train",)).values()), ctx.max_items)
    assert len(teacher) == len(windows) == len(teacher_examples(ds, ctx.max_items))
    assert teacher.prompts == [list(w[:-1]) for w, _ in windows]
    assert teacher.manifest["target"] == str(tiny_model_dir.resolve()) and teacher.kind == "beam"
    check_teacher_matches(teacher, windows, ds.codec, ds.item_codes(), ctx.max_items, tiny_model_dir)


def test_teacher_row_i_is_the_target_output_for_example_i(teacher_file, synth_dir, tiny_model_dir):
    """The reference code's off-by-one: decode example i alone and find it in row i, not i +- 1."""
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    teacher = load_teacher(teacher_file)
    examples = teacher_examples(ds, ctx.max_items)
    beam = get_decoder("beam")
    params = make_params(beam, {"beam_width": K, "k": K, "constraint": "all"})
    rows = sorted({0, 1, len(examples) - 1, *np.random.default_rng(0).choice(len(examples), 12).tolist()})
    for i in rows:
        res = beam.decode(ctx, [examples[i].prompt], params)
        assert np.array_equal(teacher.codes[i], res.codes[0].numpy()), f"row {i}"
        assert np.allclose(teacher.logprobs[i], res.scores[0].numpy(), atol=1e-4)
        assert teacher.user_id[i] == examples[i].user_id
    # the stored log-probs are the target's teacher-forced sequence log-probs of the stored SIDs
    i = rows[len(rows) // 2]
    toks = ctx.codec.codes_to_tokens(teacher.codes[i])
    for k in range(K):
        rows_k = plain_rows(ctx.model, ctx.item_tokens, teacher.prompts[i], toks[k].tolist())
        logp = sum(math.log(softmax(r)[tok]) for r, tok in zip(rows_k, toks[k].tolist()))
        assert logp == pytest.approx(teacher.logprobs[i, k], abs=1e-4)


def test_teacher_check_refuses_shifted_or_foreign_files(teacher_file, synth_dir, tiny_model_dir):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    teacher = load_teacher(teacher_file)
    windows = training_windows(list(ds.user_sequences(("train",)).values()), ctx.max_items)
    args = (ds.codec, ds.item_codes(), ctx.max_items)
    shifted = TeacherData(**{**vars(teacher), "prompts": teacher.prompts[1:] + teacher.prompts[:1]})
    with pytest.raises(UserInputError, match="row 0 holds another example"):
        check_teacher_matches(shifted, windows, *args)
    with pytest.raises(UserInputError, match="training windows"):
        check_teacher_matches(teacher, windows[:-1], *args)
    with pytest.raises(UserInputError, match="max_items"):
        check_teacher_matches(teacher, windows, ds.codec, ds.item_codes(), ctx.max_items - 1)
    with pytest.raises(UserInputError, match="target"):
        check_teacher_matches(teacher, windows, *args, target=synth_dir)


def test_sampled_teacher_rows_hold_valid_items_with_their_log_probs(synth_dir, tiny_model_dir, tmp_path):
    ctx, ds, _ = load_context(tiny_model_dir, synth_dir, "cpu")
    out = tmp_path / "sample.parquet"
    build_teacher_data(ctx, ds, K, out, sampling=True, seed=3, batch_size=64, progress=False)
    teacher = load_teacher(out)
    assert teacher.kind == "sample" and teacher.manifest["seed"] == 3 and len(teacher) > 0
    _, valid = ctx.index.lookup(torch.as_tensor(teacher.codes))
    assert bool(valid.all())
    for i in (0, len(teacher) - 1):
        toks = ctx.codec.codes_to_tokens(teacher.codes[i])
        for k in range(K):
            rows_k = plain_rows(ctx.model, ctx.item_tokens, teacher.prompts[i], toks[k].tolist())
            logp = sum(math.log(softmax(r)[tok]) for r, tok in zip(rows_k, toks[k].tolist()))
            assert logp == pytest.approx(teacher.logprobs[i, k], abs=1e-4)


def test_cli_teacher_rejects_bad_input(synth_dir, tiny_model_dir, tmp_path, capsys):
    base = ["atspeed", "teacher", "--target", str(tiny_model_dir), "--data", str(synth_dir)]
    assert run_cli([*base, "--k", "0", "--out", str(tmp_path / "t.parquet")]) == 2
    assert run_cli([*base, "--k", "3", "--out", str(tmp_path / "t.csv")]) == 2
    assert run_cli([*base, "--k", "3", "--max-items", "99", "--out", str(tmp_path / "t.parquet")]) == 2
    assert run_cli(["atspeed", "teacher", "--target", str(tmp_path), "--k", "3", "--out", "x.parquet"]) == 2
    assert "error:" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


# --- training ----------------------------------------------------------------------------------------
def test_train_config_rejects_inconsistent_alignment_options():
    for cfg, what in [
        (TrainConfig(objective="atspeed_s", target="t"), "--teacher"),
        (TrainConfig(objective="wordkd"), "--target"),
        (TrainConfig(objective="atspeed_r", target="t", teacher="f", no_dr=True), "--no-dr"),
        (TrainConfig(objective="wordkd", target="t", no_ca=True), "--no-ca"),
        (TrainConfig(objective="tvdkd", target="t", top1=True), "--top1"),
        (TrainConfig(objective="seqkd", teacher="f", alpha=1.5), "alpha"),
        (TrainConfig(objective="next_item", target="t"), "--target"),
    ]:
        with pytest.raises(UserInputError, match=what):
            cfg.validate()
    TrainConfig(objective="seqkd", teacher="f", top1=True).validate()  # SeqKD needs no --target


def test_alpha_zero_trains_the_sft_model(synth_dir, tiny_model_dir, teacher_file, tmp_path):
    common = dict(model_size="tiny", epochs=1, batch_size=64, warmup_steps=2, max_steps=3, device="cpu")
    train(synth_dir, tmp_path / "sft", TrainConfig(**common), progress=False)
    aligned = TrainConfig(
        **common, objective="atspeed_s", target=str(tiny_model_dir), teacher=str(teacher_file), alpha=0.0
    )
    train(synth_dir, tmp_path / "a0", aligned, progress=False)
    sft, a0 = load_checkpoint(tmp_path / "sft"), load_checkpoint(tmp_path / "a0")
    for name, tensor in sft.model.state_dict().items():
        assert torch.equal(tensor, a0.model.state_dict()[name]), name


def test_cli_trains_an_atspeed_s_draft_that_names_its_target(
    synth_dir, tiny_model_dir, teacher_file, tmp_path
):
    out = tmp_path / "draft"
    argv = ["train", "--data", str(synth_dir), "--out", str(out), "--objective", "atspeed_s"]
    argv += ["--target", str(tiny_model_dir), "--teacher", str(teacher_file), "--epochs", "1"]
    assert run_cli([*argv, "--warmup-steps", "2", "--device", "cpu", "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["target"] == str(tiny_model_dir.resolve()) and config["objective"] == "atspeed_s"
    assert config["alpha"] == 0.5 and config["teacher_k"] == K and config["teacher_kind"] == "beam"
    flags = {"density_reg": True, "constrained": True, "top1": False, "dr_mode": "weighted"}
    flags["all_steps"] = False
    assert config["align_flags"] == flags
    hist = config["history"][0]
    assert hist["train_rec_loss"] > 0 and math.isfinite(hist["train_align_loss"])
    draft = load_checkpoint(out)
    assert draft.codec == load_checkpoint(tiny_model_dir).codec
    # a teacher file built with another prompt window is refused before anything is written
    bad = [*argv, "--max-items", "5", "--device", "cpu", "--quiet"]
    bad[bad.index(str(out))] = str(tmp_path / "other")
    assert run_cli(bad) == 2 and not (tmp_path / "other").exists()
