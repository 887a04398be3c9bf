"""Feature layouts of a fusion MatMul's input, and the reorganisation into [user | item | cross].

A fragmented layout interleaves user, cross and item column chunks (years of features appended one by
one). Applied to it directly, eq. 7 becomes one small MatMul per chunk. Reorganising permutes the input
columns into the neat order and the weight's rows with the same permutation, so X[:, p] @ W[p] == X @ W
exactly (a permutation of the sum's terms), and eq. 7 then needs three MatMuls.

Weights here are in the math orientation [D_in, D_out] (nn.Linear stores the transpose).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrec.workloads.errors import UserInputError

KINDS = ("user", "item", "cross")


@dataclass(frozen=True)
class Chunk:
    kind: str  # user | item | cross
    width: int


@dataclass(frozen=True)
class FeatureLayout:
    chunks: tuple[Chunk, ...]

    def __post_init__(self) -> None:
        for c in self.chunks:
            if c.kind not in KINDS or c.width < 1:
                raise UserInputError(f"layout chunk {c}: kind must be one of {KINDS} and width >= 1")

    @property
    def width(self) -> int:
        return sum(c.width for c in self.chunks)

    def kind_width(self, kind: str) -> int:
        return sum(c.width for c in self.chunks if c.kind == kind)

    def offsets(self) -> list[int]:
        out, at = [], 0
        for c in self.chunks:
            out.append(at)
            at += c.width
        return out

    def neat_permutation(self) -> torch.Tensor:
        """Column indices p such that X[:, p] is [user | item | cross], each kind in its chunk order."""
        cols = []
        for kind in KINDS:
            for c, start in zip(self.chunks, self.offsets()):
                if c.kind == kind:
                    cols.append(torch.arange(start, start + c.width))
        return torch.cat(cols)

    def neat(self) -> FeatureLayout:
        return FeatureLayout(tuple(Chunk(k, self.kind_width(k)) for k in KINDS if self.kind_width(k)))


def fragmented_layout(d_user: int, d_item: int, d_cross: int, chunk: int) -> FeatureLayout:
    """Round-robin user, cross, item chunks of `chunk` columns (the last of a kind may be shorter)."""
    if chunk < 1:
        raise UserInputError(f"chunk size must be >= 1, got {chunk}")
    left = {"user": d_user, "cross": d_cross, "item": d_item}
    chunks = []
    while any(left.values()):
        for kind in ("user", "cross", "item"):
            w = min(chunk, left[kind])
            if w:
                chunks.append(Chunk(kind, w))
                left[kind] -= w
    return FeatureLayout(tuple(chunks))


def reorganize(
    x: torch.Tensor, weight: torch.Tensor, layout: FeatureLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """(X in neat column order, W with rows remapped to match); X @ W is unchanged."""
    if x.shape[-1] != layout.width or weight.shape[0] != layout.width:
        raise UserInputError(
            f"reorganize: layout has {layout.width} columns, X has {x.shape[-1]}, "
            f"W has {weight.shape[0]} rows"
        )
    p = layout.neat_permutation().to(x.device)
    return x[..., p], weight[p]


def reorganize_linear_weight(linear_weight: torch.Tensor, layout: FeatureLayout) -> torch.Tensor:
    """nn.Linear.weight [out, in] with its input columns remapped to the neat order."""
    return linear_weight[:, layout.neat_permutation().to(linear_weight.device)]


def split_rows(weight: torch.Tensor, layout: FeatureLayout) -> list[torch.Tensor]:
    """W's row blocks, one per chunk, contiguous (what a chunk-wise MatMul multiplies by)."""
    return [weight[s : s + c.width].contiguous() for c, s in zip(layout.chunks, layout.offsets())]


def mari_chunked(
    user_parts: list[torch.Tensor],
    cand_parts: list[torch.Tensor],
    user_w: list[torch.Tensor],
    cand_w: list[torch.Tensor],
    bias: torch.Tensor,
) -> torch.Tensor:
    """eq. 7 over any number of column blocks: user blocks on one row, candidate blocks on B rows.

    With a neat layout there is one user block and one block per candidate kind; with a fragmented
    one there is a block per chunk, each a small MatMul that rereads and rewrites the [B, d] output.
    """
    acc = bias
    for p, w in zip(user_parts, user_w):
        acc = torch.addmm(acc, p, w)
    out = torch.addmm(acc, cand_parts[0], cand_w[0])  # broadcasts the one-row user sum over B rows
    for p, w in zip(cand_parts[1:], cand_w[1:]):
        torch.addmm(out, p, w, out=out)  # in place
    return out


def chunk_inputs(
    user_row: torch.Tensor, cand: torch.Tensor, weight: torch.Tensor, layout: FeatureLayout
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Split a request in `layout` into mari_chunked's arguments.

    user_row [1, D] and cand [B, D] hold the user's and the candidates' values in their own columns of
    the layout (zeros elsewhere); candidate chunks are column views of `cand` (no copy), as they would
    be of one packed feature tensor.
    """
    blocks = split_rows(weight, layout)
    up, cp, uw, cw = [], [], [], []
    for c, s, w in zip(layout.chunks, layout.offsets(), blocks):
        if c.kind == "user":
            up.append(user_row[:, s : s + c.width])
            uw.append(w)
        else:
            cp.append(cand[:, s : s + c.width])
            cw.append(w)
    return up, cp, uw, cw
