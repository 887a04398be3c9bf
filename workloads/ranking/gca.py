"""Graph colouring (MaRI Algorithm 1) on a torch.fx graph, and the rewrite of what it finds into eq. 7.

Colouring: user-side inputs are YELLOW, item and cross inputs BLUE; colours flow downstream by DFS, BLUE
over-writing anything and YELLOW filling only uncoloured nodes, so a node ends BLUE when any candidate
feature reaches it and YELLOW when only user features do. Shape reads (`x.size(0)`, `x.shape`) carry no
feature values, so they do not pass colour on: otherwise the expand that tiles a user tensor to the
candidates' row count would turn BLUE through its size argument and hide every mixed concatenation.

Detection: every concatenation along the last dim with both colours among its inputs; from it, every
nn.Linear reachable through non-computational nodes only (NON_COMPUTATIONAL: identities that keep each
row's columns where they are, so the weight can still be split by the concat's column blocks).

Rewrite: each found Linear becomes a `MaRILinear` called on the concat's parts, with YELLOW parts taken
from before their tile (expand) so the user-side product runs on one row and is broadcast in the add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from genrec.workloads.errors import UserInputError

YELLOW, BLUE = "yellow", "blue"

# ops that move no feature values (they only read shapes)
SHAPE_METHODS = frozenset({"size", "dim"})
# identities between a concat and a Linear that keep each row's columns in place (inference mode)
NON_COMPUTATIONAL_METHODS = frozenset({"contiguous", "clone", "detach", "to", "float"})
NON_COMPUTATIONAL_MODULES = (nn.Dropout, nn.Identity)
# how a user tensor is tiled to the candidates' rows; stripped to reach the untiled [1, D] tensor
TILE_METHODS = frozenset({"expand", "expand_as", "repeat"})
CAT_FUNCTIONS = (torch.cat, torch.concat)


@dataclass(frozen=True)
class Eligible:
    linear: str  # fx node name of the nn.Linear call
    target: str  # its module path
    concat: str  # the mixed concatenation feeding it


def _is_shape_read(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in SHAPE_METHODS:
        return True
    return node.op == "call_function" and node.target is getattr and node.args[1] in ("shape", "ndim")


def color_graph(graph: fx.Graph, user_inputs: set[str], item_inputs: set[str]) -> dict[fx.Node, str]:
    """Algorithm 1, steps 1-2: initial colours on placeholders, DFS propagation."""
    placeholders = {n.name for n in graph.nodes if n.op == "placeholder"}
    unknown = (user_inputs | item_inputs) - placeholders
    if unknown:
        raise UserInputError(
            f"GCA: inputs {sorted(unknown)} are not graph inputs; inputs: {sorted(placeholders)}"
        )
    color: dict[fx.Node, str] = {}
    for n in graph.nodes:
        if n.name in user_inputs:
            color[n] = YELLOW
        elif n.name in item_inputs:
            color[n] = BLUE
    stack = list(color)
    while stack:
        u = stack.pop()
        for v in u.users:
            if _is_shape_read(v):
                continue
            if color[u] == BLUE and color.get(v) != BLUE:
                color[v] = BLUE
                stack.append(v)
            elif color[u] == YELLOW and v not in color:
                color[v] = YELLOW
                stack.append(v)
    return color


def _is_cat(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in CAT_FUNCTIONS


def _cat_dim(node: fx.Node) -> int:
    if len(node.args) > 1:
        return int(node.args[1])
    return int(node.kwargs.get("dim", 0))


def _is_linear(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.Linear)


def _is_non_computational(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in NON_COMPUTATIONAL_METHODS
    if node.op == "call_module":
        return isinstance(gm.get_submodule(node.target), NON_COMPUTATIONAL_MODULES)
    return False


def _last_dim(node: fx.Node, dim: int) -> bool:
    meta = node.meta.get("tensor_meta")
    if meta is None:
        return dim == -1
    return dim in (-1, len(meta.shape) - 1)


def find_eligible(
    gm: fx.GraphModule, user_inputs: set[str], item_inputs: set[str]
) -> tuple[list[Eligible], dict[fx.Node, str]]:
    """Algorithm 1, step 3: Linear nodes reachable from a mixed concat via non-computational nodes."""
    color = color_graph(gm.graph, user_inputs, item_inputs)
    found: dict[str, Eligible] = {}
    for c in gm.graph.nodes:
        if not _is_cat(c):
            continue
        inputs = [a for a in c.args[0] if isinstance(a, fx.Node)]
        if not ({YELLOW, BLUE} <= {color.get(a) for a in inputs}):
            continue
        if not _last_dim(c, _cat_dim(c)):
            continue  # a concat along rows or sequence positions does not split the weight
        stack, seen = [c], {c}
        while stack:  # DFS; `seen` is the traverse purging the paper mentions
            u = stack.pop()
            for v in u.users:
                if v in seen:
                    continue
                seen.add(v)
                if _is_linear(gm, v) and v.args[0] is u:
                    found.setdefault(v.name, Eligible(v.name, str(v.target), c.name))
                elif _is_non_computational(gm, v):
                    stack.append(v)
    return list(found.values()), color


class MaRILinear(nn.Module):
    """eq. 7: sum over column blocks of part_i @ W_i + b, the user blocks computed on their own rows
    (one per request) and broadcast by addmm into the candidates' rows."""

    def __init__(self, linear: nn.Linear, widths: list[int], colors: list[str]) -> None:
        super().__init__()
        if sum(widths) != linear.in_features:
            raise ValueError(f"part widths {widths} do not add up to in_features {linear.in_features}")
        w = linear.weight.detach().t()  # [in, out]
        starts = [sum(widths[:i]) for i in range(len(widths))]
        self.colors = tuple(colors)
        self.weights = nn.ParameterList(
            nn.Parameter(w[s : s + n].contiguous(), requires_grad=False) for s, n in zip(starts, widths)
        )
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(linear.out_features)
        self.bias = nn.Parameter(bias.clone().unsqueeze(0), requires_grad=False)
        # user blocks first: their one-row sum seeds the accumulator that the candidate blocks broadcast into
        self.order = tuple(i for i, c in enumerate(colors) if c == YELLOW) + tuple(
            i for i, c in enumerate(colors) if c != YELLOW
        )

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        acc, owned = self.bias, False
        for i in self.order:
            p, w = parts[i], self.weights[i]
            if p.dim() != 2 or acc.dim() != 2:
                acc, owned = acc + torch.matmul(p, w), True
            elif owned and acc.shape[0] == p.shape[0]:
                torch.addmm(acc, p, w, out=acc)  # in place: acc is our own buffer
            else:
                acc, owned = torch.addmm(acc, p, w), True  # broadcasts a one-row acc over p's rows
        return acc


def _strip_tile(node: fx.Node) -> fx.Node:
    while node.op == "call_method" and node.target in TILE_METHODS:
        node = node.args[0]
    return node


def _width(node: fx.Node) -> int:
    meta = node.meta.get("tensor_meta")
    if meta is None:
        raise UserInputError(f"GCA rewrite: no shape recorded for node {node.name}; pass example inputs")
    return int(meta.shape[-1])


def mari_rewrite(
    model: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    user_inputs: set[str],
    item_inputs: set[str],
) -> tuple[fx.GraphModule, list[Eligible]]:
    """Trace `model`, colour it, and replace every eligible Linear with a MaRILinear (same weights).

    example_inputs fix the concat parts' widths (ShapeProp); their row counts do not matter.
    The returned module takes the same inputs; call it with one-row user tensors to get the saving.
    """
    gm = fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*example_inputs)
    eligible, color = find_eligible(gm, user_inputs, item_inputs)
    nodes = {n.name: n for n in gm.graph.nodes}
    for k, e in enumerate(eligible):
        lin_node, cat_node = nodes[e.linear], nodes[e.concat]
        parts = list(cat_node.args[0])
        widths = [_width(p) for p in parts]
        colors = [color.get(p, YELLOW) for p in parts]  # uncoloured parts (constants) ride with the user
        args = tuple(_strip_tile(p) if c == YELLOW else p for p, c in zip(parts, colors))
        name = f"mari_{k}_" + e.target.replace(".", "_")
        gm.add_submodule(name, MaRILinear(gm.get_submodule(e.target), widths, colors))
        with gm.graph.inserting_before(lin_node):
            new = gm.graph.call_module(name, args)
        new.meta = dict(lin_node.meta)
        lin_node.replace_all_uses_with(new)
        gm.graph.erase_node(lin_node)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm, eligible


def linear_targets(gm: fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if _is_linear(gm, n)}


__all__ = [
    "BLUE",
    "YELLOW",
    "Eligible",
    "MaRILinear",
    "color_graph",
    "find_eligible",
    "linear_targets",
    "mari_rewrite",
]
