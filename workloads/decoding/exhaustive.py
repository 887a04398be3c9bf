"""Slow, obviously correct reference: score every SID in the space and sort.

Each SID's score is the sum over levels of the model's full-vocabulary log-softmax at that
level's token, computed by full recomputation (no KV cache). Only for tiny vocabularies.
"""

from __future__ import annotations

import itertools

import torch

from genrec.workloads.decoding.base import DecoderContext


@torch.no_grad()
def exhaustive_top_k(
    ctx: DecoderContext, histories: list[list[int]], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (codes [B, K, L], scores [B, K]) of the K best SIDs in the whole space."""
    codec = ctx.codec
    if codec.num_sids > 20_000:
        raise ValueError(f"exhaustive search over {codec.num_sids} SIDs is too slow for a reference")
    all_codes = torch.tensor(list(itertools.product(*(range(t) for t in codec.codebook_sizes))))
    sid_tokens = codec.codes_to_tokens(all_codes)  # [N, L]
    out_codes, out_scores = [], []
    for h in histories:
        prompt, mask = ctx.prompts([h])
        n = len(all_codes)
        seq = torch.cat([prompt.expand(n, -1), sid_tokens[:, :-1]], dim=1)
        seq_mask = torch.cat([mask.expand(n, -1), torch.ones(n, codec.levels - 1, dtype=torch.bool)], dim=1)
        logits, _ = ctx.model(seq, seq_mask)
        logp = torch.log_softmax(
            logits[:, -codec.levels :].float(), dim=-1
        )  # positions predicting SID tokens
        score = logp.gather(-1, sid_tokens[..., None])[..., 0].sum(-1)
        top = score.topk(k)
        out_codes.append(all_codes[top.indices])
        out_scores.append(top.values)
    return torch.stack(out_codes), torch.stack(out_scores)
