"""FLOPs counted by torch while the ops run match the closed forms of MaRI appendix B."""

from __future__ import annotations

import pytest
import torch

from genrec.workloads.ranking import flops as F
from genrec.workloads.ranking.model import RankingConfig, init_model
from genrec.workloads.ranking.modes import RankingScorer


@pytest.mark.parametrize("b,du,di,dc,d", [(7, 13, 5, 3, 11), (100, 400, 100, 0, 32), (1, 4, 4, 4, 4)])
def test_matmul_flops_match_eq8_and_eq9(b, du, di, dc, d):
    xu, xi, xc = torch.randn(1, du), torch.randn(b, di), torch.randn(b, dc)
    w = torch.randn(du + di + dc, d)
    x = torch.cat([xu.expand(b, -1), xi, xc], 1)
    assert (
        F.counted_flops(lambda: x @ w)
        == F.matmul_flops_vanilla(b, du, di, dc, d)
        == 2 * b * d * (du + di + dc)
    )

    def mari():
        out = (xu @ w[:du]) + xi @ w[du : du + di]
        return out + xc @ w[du + di :] if dc else out

    assert F.counted_flops(mari) == F.matmul_flops_mari(b, du, di, dc, d) == 2 * d * (du + b * (di + dc))
    assert F.flops_speedup(b, du, di, dc, d) == pytest.approx(b * (du + di + dc) / (du + b * (di + dc)))


def test_paper_table2_flops_column():
    # the B sweep needs D_cross = D_item = 1000 to give 2.94 .. 3.00; the others D_cross = 0
    assert F.flops_speedup(100, 4000, 1000, 1000, 512) == pytest.approx(2.94, abs=0.005)
    assert F.flops_speedup(2000, 10000, 1000, 0, 512) == pytest.approx(10.95, abs=0.005)
    assert F.flops_speedup(2000, 4000, 500, 0, 512) == pytest.approx(8.96, abs=0.005)


@pytest.mark.parametrize("b,seq_len,d", [(10, 4, 8), (50, 20, 16)])
def test_cross_attention_projection_flops_match_b1(b, seq_len, d):
    wq, wk, wv = (torch.randn(d, d) for _ in range(3))
    xq, seq = torch.randn(b, d), torch.randn(1, seq_len, d)
    tiled = seq.expand(b, -1, -1)
    vani = F.counted_flops(lambda: (xq @ wq, tiled @ wk, tiled @ wv))
    uoi = F.counted_flops(lambda: (xq @ wq, seq @ wk, seq @ wv))
    assert vani == F.attention_projection_flops_vani(b, seq_len, d) == 2 * b * d * d * (1 + 2 * seq_len)
    assert uoi == F.attention_projection_flops_uoi(b, seq_len, d) == 2 * (b * d * d + 2 * seq_len * d * d)


def test_model_flops_per_rewritten_matmul_and_mode_order():
    cfg = RankingConfig(d_user=64, d_seq=8, seq_len=10, d_item=16, d_cross=4, d_attn=8, d_hidden=16)
    scorer = RankingScorer(init_model(cfg))
    b = 50
    profile, seq = torch.randn(1, cfg.d_user), torch.randn(1, cfg.seq_len, cfg.d_seq)
    items, cross = torch.randn(b, cfg.d_item), torch.randn(b, cfg.d_cross)
    counted = {
        m: F.counted_flops(lambda m=m: scorer.run(profile, seq, items, cross, m))
        for m in ("vani", "uoi", "mari")
    }
    assert counted["vani"] > counted["uoi"] > counted["mari"]
    # every rewritten MatMul costs eq. 9 where its nn.Linear on the tiled concat costs eq. 8
    gm = scorer.mari_module
    for e in scorer.eligible:
        mod = [
            m
            for n, m in gm.named_children()
            if n.startswith("mari_") and n.endswith(e.target.replace(".", "_"))
        ]
        mari = mod[0]
        widths = [w.shape[0] for w in mari.weights]
        d = mari.weights[0].shape[1]
        d_user = sum(w for w, c in zip(widths, mari.colors) if c == "yellow")
        d_cand = sum(widths) - d_user
        parts = [torch.randn(1 if c == "yellow" else b, w) for w, c in zip(widths, mari.colors)]
        tiled = torch.cat([p.expand(b, -1) for p in parts], 1)
        linear = scorer.model.get_submodule(e.target)
        assert F.counted_flops(lambda lin=linear, x=tiled: lin(x)) == F.matmul_flops_vanilla(
            b, d_user, d_cand, 0, d
        )
        assert F.counted_flops(lambda m=mari, ps=parts: m(*ps)) == F.matmul_flops_mari(
            b, d_user, d_cand, 0, d
        )
        torch.testing.assert_close(mari(*parts), linear(tiled), rtol=1e-5, atol=1e-5)
