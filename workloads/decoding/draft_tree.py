"""The flattened draft tree AtSpeed's target verifies in one cached forward (appendix A.3).

Per user one block of tokens: the K committed beams' paths (their codes at levels 0..t-1, so the
drafted tokens have their context), then the drafted beams of every drafted level (N per level).
Each node's parent is the previous token on its path (-1: the prompt), and the tree mask lets a node
see exactly its ancestors, so one `extend` gives the target's next-level logits at every node:

    node(k, l)       committed beam k at level l            index k * t + l
    node(j, n)       drafted beam n at drafted level j      index K * t + j * N + n

`tree_mask_from_parents` builds the [B, n, n] ancestor mask; `verify_logits` runs the target over
the block, as one tree call or (the "w/o TA" ablation) one call per drafted level with each beam's
path as its own row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from genrec.workloads.models.kv_cache import KVCache
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec


@dataclass(frozen=True)
class DraftLevel:
    """The drafted beams of one level: parent (index into the previous drafted level's N beams, or into
    the K committed beams for the first drafted level) and code."""

    parent: Tensor  # [B, N]
    code: Tensor  # [B, N]


@dataclass(frozen=True)
class DraftTree:
    committed: Tensor  # [B, K, t] codes of the committed beams
    levels: list[DraftLevel]  # drafted levels t, t+1, ... (gamma of them)

    @property
    def t(self) -> int:
        return self.committed.shape[2]

    @property
    def k(self) -> int:
        return self.committed.shape[1]

    @property
    def n(self) -> int:
        return self.levels[0].parent.shape[1] if self.levels else 0

    def committed_index(self, beam: Tensor) -> Tensor:
        """Node index of committed beam `beam`'s last token (t >= 1)."""
        return beam * self.t + (self.t - 1)

    def drafted_index(self, j: int, beam: Tensor) -> Tensor:
        return self.k * self.t + j * self.n + beam


def tree_tokens_and_parents(tree: DraftTree, codec: SIDCodec) -> tuple[Tensor, Tensor]:
    """Token ids [B, n] (the codec's: level-offset or an imported table) and parent node indices [B, n]
    (-1 = the prompt) of the block."""
    b, k, t = tree.committed.shape
    device = tree.committed.device
    tokens, parents = [], []
    if t:
        tokens.append(codec.prefix_to_tokens(tree.committed).reshape(b, k * t))
        own = torch.arange(k * t, device=device).view(k, t)
        par = torch.where(torch.arange(t, device=device) == 0, -1, own - 1)
        parents.append(par.reshape(1, k * t).expand(b, -1))
    for j, level in enumerate(tree.levels):
        tokens.append(codec.level_tokens(t + j, level.code))
        if j == 0:
            par = tree.committed_index(level.parent) if t else torch.full_like(level.parent, -1)
        else:
            par = tree.drafted_index(j - 1, level.parent)
        parents.append(par)
    return torch.cat(tokens, dim=1), torch.cat(parents, dim=1)


def tree_mask_from_parents(parents: Tensor, depth: int) -> Tensor:
    """[B, n, n] bool: node i sees node j iff j is i or an ancestor of i (paths at most `depth` long)."""
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    mask = eye.clone()
    up = parents
    for _ in range(depth):
        has = up >= 0
        hit = torch.zeros_like(mask)
        hit.scatter_(2, up.clamp(min=0)[..., None], has[..., None])
        mask |= hit
        up = torch.where(has, parents.gather(1, up.clamp(min=0)), -1)
    return mask


@torch.no_grad()
def verify_logits(
    model: GRTransformer,
    prompt: KVCache,
    tree: DraftTree,
    codec: SIDCodec,
    tree_attention: bool = True,
    attention: str = "torch",
    hidden: bool = False,
) -> tuple[Tensor, int]:
    """The target's logits [B, n, V] at every node of the block (with `hidden`: its final hidden states
    [B, n, D], for level_softmax scoring), and the number of target calls."""
    tokens, parents = tree_tokens_and_parents(tree, codec)
    b, n = tokens.shape
    if n == 0:
        width = model.config.dim if hidden else model.config.vocab_size
        return tokens.new_zeros(b, 0, width, dtype=torch.float32), 0
    if tree_attention:
        cache = prompt.expand(1, n)
        mask = tree_mask_from_parents(parents, tree.t + len(tree.levels))
        out = model.extend(tokens, cache, mask, attention, logits=not hidden)
        return (out.hidden if hidden else out.logits), 1
    return _per_level_logits(model, prompt, tokens, parents, tree, attention, hidden)


def _per_level_logits(
    model: GRTransformer,
    prompt: KVCache,
    tokens: Tensor,
    parents: Tensor,
    tree: DraftTree,
    attention: str,
    hidden: bool = False,
) -> tuple[Tensor, int]:
    """ "w/o TA": one target call per level (the committed beams, then each drafted level), every node's
    root path as its own causal row. Only those nodes' logits are filled: verification reads no other."""
    b, n = tokens.shape
    depth = tree.t + len(tree.levels)
    # paths[b, i, :] = the tokens from the root to node i (left-aligned), lengths = depth of i + 1
    path_nodes = torch.full((b, n, depth), -1, dtype=torch.long, device=tokens.device)
    node = torch.arange(n, device=tokens.device).expand(b, n)
    lengths = torch.zeros(b, n, dtype=torch.long, device=tokens.device)
    for d in range(depth):
        path_nodes[:, :, d] = node
        lengths += (node >= 0).long()
        node = torch.where(node >= 0, parents.gather(1, node.clamp(min=0)), -1)
    width = model.config.dim if hidden else model.config.vocab_size
    out = torch.zeros(b, n, width, device=tokens.device)  # unread nodes stay 0
    calls = 0
    # the nodes whose logits verification reads: committed beams' last tokens, then each drafted level
    groups = [tree.committed_index(torch.arange(tree.k, device=tokens.device))] if tree.t else []
    groups += [
        tree.drafted_index(j, torch.arange(tree.n, device=tokens.device)) for j in range(len(tree.levels))
    ]
    for nodes in groups:
        length = int(lengths[0, nodes[0]])  # every node of a group has the same depth
        seq_nodes = path_nodes[:, nodes, :length].flip(-1)  # root first
        seq = tokens.gather(1, seq_nodes.reshape(b, -1)).view(b * len(nodes), length)
        cache = prompt.expand(len(nodes), length)
        step = model.extend(seq, cache, None, attention, logits=not hidden)
        out[:, nodes] = (step.hidden if hidden else step.logits)[:, -1].view(b, len(nodes), -1)
        calls += 1
    return out, calls
