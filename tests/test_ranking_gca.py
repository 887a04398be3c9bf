"""Graph colouring (MaRI Algorithm 1): exactly the eligible MatMuls of the reference model and of a
differently built variant, none of the ineligible ones, and the rewrite keeps the outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from genrec.workloads.ranking.gca import BLUE, YELLOW, MaRILinear, color_graph, find_eligible, mari_rewrite
from genrec.workloads.ranking.model import RankingConfig, RankingModel, eligible_reference_nodes, tile

USER, ITEMS = {"profile", "seq"}, {"item", "cross"}


def test_reference_model_eligible_nodes_are_query_expert_and_tower_first_fcs():
    cfg = RankingConfig(experts=3, tasks=2)
    gm = fx.symbolic_trace(RankingModel(cfg))
    eligible, color = find_eligible(gm, USER, ITEMS)
    found = {e.target for e in eligible}
    assert found == eligible_reference_nodes(cfg)
    assert len(found) == 1 + 3 + 2
    colors = {n.target: color.get(n) for n in gm.graph.nodes if n.op == "call_module"}
    # user-only modules stay yellow and are never rewritten
    for target in ("key", "value", "user_emb", "gates"):
        assert colors[target] == YELLOW and target not in found
    # second layers are fed by computation (ReLU), not by a concat: blue but ineligible
    assert colors["experts.0.fc2"] == BLUE and "experts.0.fc2" not in found
    assert colors["towers.1.out"] == BLUE and "towers.1.out" not in found


class Variant(nn.Module):
    """Another structure: interleaved concat order, a Dropout and a .contiguous() between concat and
    Linear, user-only and candidate-only concats, a Linear behind a ReLU of a mixed concat, and a mixed
    concat that itself takes the output of a rewritten Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.user_a = nn.Linear(6, 5)
        self.drop = nn.Dropout(0.1)
        self.mix1 = nn.Linear(4 + 6 + 3 + 5, 8)
        self.after_relu = nn.Linear(18, 8)
        self.uu = nn.Linear(6 + 5, 7)
        self.ii = nn.Linear(4 + 3, 7)
        self.mix2 = nn.Linear(7 + 7 + 8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, user, item, cross):
        ua = F.relu(self.user_a(user))
        x = torch.cat([item, tile(user, item), cross, tile(ua, item)], dim=-1)
        h1 = self.mix1(self.drop(x))
        h2 = self.after_relu(F.relu(x))
        uu = self.uu(torch.cat([user, ua], -1))
        ii = self.ii(torch.cat([item, cross], -1))
        z = torch.cat([tile(uu, item), ii, h1], -1).contiguous()
        return self.head(F.relu(self.mix2(z)) + h2)


def test_variant_eligible_nodes():
    gm = fx.symbolic_trace(Variant())
    eligible, color = find_eligible(gm, {"user"}, {"item", "cross"})
    assert {e.target for e in eligible} == {"mix1", "mix2"}
    by_target = {n.target: n for n in gm.graph.nodes if n.op == "call_module"}
    assert color[by_target["uu"]] == YELLOW and color[by_target["ii"]] == BLUE


def test_variant_rewrite_keeps_outputs_on_one_user_row():
    torch.manual_seed(0)
    model = Variant().eval()
    b = 9
    user, item, cross = torch.randn(1, 6), torch.randn(b, 4), torch.randn(b, 3)
    gm, eligible = mari_rewrite(model, (user, item[:2], cross[:2]), {"user"}, {"item", "cross"})
    assert len(eligible) == 2
    mari_modules = [m for m in gm.modules() if isinstance(m, MaRILinear)]
    assert len(mari_modules) == 2 and all(len(m.weights) in (3, 4) for m in mari_modules)
    with torch.inference_mode():
        ref = model(user.expand(b, -1).contiguous(), item, cross)  # VanI: user tiled at batching
        torch.testing.assert_close(gm(user, item, cross), ref, rtol=1e-5, atol=1e-6)


def test_shape_reads_do_not_carry_colour():
    gm = fx.symbolic_trace(Variant())
    color = color_graph(gm.graph, {"user"}, {"item", "cross"})
    sizes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is getattr]
    assert sizes and all(n not in color for n in sizes)
    expands = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "expand"]
    assert expands and all(color[n] == YELLOW for n in expands)


def test_unknown_inputs_are_rejected():
    import pytest

    from genrec.workloads.errors import UserInputError

    gm = fx.symbolic_trace(Variant())
    with pytest.raises(UserInputError, match="not graph inputs"):
        color_graph(gm.graph, {"usr"}, {"item"})
