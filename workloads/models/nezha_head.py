"""Draft heads that decode a whole SID from one prefill: NEZHA's autoregressive head and the MTP baseline.

NEZHA (paper section 3.2). The prompt is the history followed by L placeholder tokens
<SP_1>..<SP_L>; one prefill gives the final hidden states h_0 (last history token) and h_1..h_L
(one per placeholder). The head then runs, for l = 1..L,

    s_1     = h_0                                   (eq. 1)
    p_l     = softmax(W_l [h_l ; s_l] + b_l)        (eq. 2, our combination: concatenation -> linear)
    s_{l+1} = tanh(A_l s_l + B_l e_l + c_l)         (eq. 3, an Elman RNN cell per level)

where e_l is a per-level learned embedding of the chosen level-l code. Concatenation followed by
one linear layer is the same as W_h h_l + W_s s_l: each state gets its own projection into the
level's code logits. Ablation switches (section 4.3):
    use_context=False      NEZHA-1: p_l from h_l only; no state and no transition
    use_placeholder=False  NEZHA-2: p_l from s_l only; the prompt needs no placeholders
    transition="add"       NEZHA-3: s_{l+1} = s_l + e_l instead of the RNN cell
(NEZHA-4, no verification, is a decoding switch: see decoding/nezha.py.)

MTP (the paper's baseline): L parallel linear heads on the shared last hidden state h_0, p_l =
softmax(W_l h_0 + b_l); the levels are independent given the prompt.

Both heads expose the same stepping interface so one batched beam search drives either:
    s = head.init_state(states)            states [N, L+1, D] (MTP reads only states[:, 0])
    logits = head.level_logits(l, states, s)
    logits = head.beam_logits(l, states, s, w)   # w beams per user at once: [B, w, T_l]
    s = head.transition(l, s, codes)

A head travels beside its backbone (Checkpoint.head, DecoderContext.draft_head) and is never
registered as a submodule, so the backbone's state_dict, and the Hugging Face bridge built on it,
stay unchanged; checkpoints save
its tensors under the `draft_head.` prefix in the same safetensors file and its config in config.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

HEAD_PREFIX = "draft_head."
HEAD_KINDS = ("nezha", "mtp")
TRANSITIONS = ("rnn", "add")

# training-time variants of the NEZHA head (section 4.3); NEZHA-4 is verify="none" at decoding
HEAD_VARIANTS: dict[str, dict] = {
    "full": {},
    "no_context": {"use_context": False},  # NEZHA-1
    "no_placeholder": {"use_placeholder": False},  # NEZHA-2
    "add": {"transition": "add"},  # NEZHA-3
}


@dataclass(frozen=True)
class HeadConfig:
    kind: str  # nezha | mtp
    dim: int
    codebook_sizes: tuple[int, ...]
    use_context: bool = True
    use_placeholder: bool = True
    transition: str = "rnn"
    # the token ids fed as <SP_1>..<SP_L>: empty for our vocabulary (codec.placeholder_token); a head on
    # an imported (frozen) backbone, whose vocabulary has no such tokens, names ids it already embeds
    placeholder_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "codebook_sizes", tuple(int(t) for t in self.codebook_sizes))
        object.__setattr__(self, "placeholder_ids", tuple(int(t) for t in self.placeholder_ids))
        if self.placeholder_ids and len(self.placeholder_ids) != len(self.codebook_sizes):
            raise ValueError(
                f"placeholder_ids has {len(self.placeholder_ids)} ids for {len(self.codebook_sizes)} levels"
            )
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        if self.transition not in TRANSITIONS:
            raise ValueError(f"transition must be one of {TRANSITIONS}, got {self.transition!r}")
        if self.kind == "nezha" and not (self.use_context or self.use_placeholder):
            raise ValueError("a NEZHA head needs the context state, the placeholder states, or both")

    @property
    def levels(self) -> int:
        return len(self.codebook_sizes)

    @property
    def needs_placeholders(self) -> bool:
        """Whether the prompt must end with <SP_1>..<SP_L> (otherwise only h_0 is read)."""
        return self.kind == "nezha" and self.use_placeholder

    def to_dict(self) -> dict:
        d = asdict(self)
        d["codebook_sizes"] = list(self.codebook_sizes)
        if self.placeholder_ids:
            d["placeholder_ids"] = list(self.placeholder_ids)
        else:  # configs written before the field existed stay byte-identical
            del d["placeholder_ids"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HeadConfig:
        ids = tuple(d.get("placeholder_ids", ()))
        return cls(**{**d, "codebook_sizes": tuple(d["codebook_sizes"]), "placeholder_ids": ids})

    def placeholders(self, codec) -> list[int]:
        """The ids fed as <SP_1>..<SP_L>: this head's own, else the codec's reserved tokens."""
        if self.placeholder_ids:
            return list(self.placeholder_ids)
        return [codec.placeholder_token(l) for l in range(codec.levels)]

    @classmethod
    def for_variant(
        cls,
        kind: str,
        dim: int,
        codebook_sizes: tuple[int, ...],
        variant: str,
        placeholder_ids: tuple[int, ...] = (),
    ) -> HeadConfig:
        if variant not in HEAD_VARIANTS:
            raise ValueError(f"head variant must be one of {sorted(HEAD_VARIANTS)}, got {variant!r}")
        if kind != "nezha" and variant != "full":
            raise ValueError(f"head variant {variant!r} applies to the nezha head only")
        base = cls(kind, dim, tuple(codebook_sizes), placeholder_ids=tuple(placeholder_ids))
        return replace(base, **HEAD_VARIANTS[variant])


class NezhaHead(nn.Module):
    """Autoregressive draft head: per-level logit head (eq. 2) + per-level transition (eq. 3)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.config = cfg
        d, sizes = cfg.dim, cfg.codebook_sizes
        in_dim = d * (int(cfg.use_context) + int(cfg.use_placeholder))
        self.logit = nn.ModuleList(nn.Linear(in_dim, t) for t in sizes)
        # transitions exist for levels 1..L-1 only: s_{L+1} is never read
        n_trans = cfg.levels - 1 if cfg.use_context else 0
        self.code_embed = nn.ModuleList(nn.Embedding(t, d) for t in sizes[:n_trans])
        self.rnn = nn.ModuleList(nn.RNNCell(d, d) for _ in range(n_trans if cfg.transition == "rnn" else 0))
        for emb in self.code_embed:
            nn.init.normal_(emb.weight, std=0.02)

    def init_state(self, states: Tensor) -> Tensor | None:
        """s_1 = h_0 (states [N, L+1, D] or [N, 1, D])."""
        return states[:, 0] if self.config.use_context else None

    def level_logits(self, level: int, states: Tensor, s: Tensor | None) -> Tensor:
        """Logits [N, T_level] over level `level`'s codes (0-based) from h_{level+1} and s_{level+1}."""
        parts = []
        if self.config.use_placeholder:
            parts.append(states[:, level + 1])
        if self.config.use_context:
            parts.append(s)
        x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return self.logit[level](x)

    def beam_logits(self, level: int, states: Tensor, s: Tensor | None, beams: int) -> Tensor:
        """level_logits for `beams` beams per user at once: [B, beams, T] (s is [B * beams, D]).

        Equal to level_logits on states repeated per beam, but the placeholder term W_h h_l is
        computed once per user and broadcast over its beams (the linear layer over the concatenation
        splits into W_h h_l + W_s s_l), which saves a copy of the states and half the products.
        """
        layer, b = self.logit[level], states.shape[0]
        d = self.config.dim
        if not self.config.use_context:  # NEZHA-1: the same logits for every beam of a user
            return layer(states[:, level + 1])[:, None].expand(b, beams, -1)
        if not self.config.use_placeholder:  # NEZHA-2
            return layer(s).view(b, beams, -1)
        w_h, w_s = layer.weight[:, :d], layer.weight[:, d:]
        placeholder = F.linear(states[:, level + 1], w_h, layer.bias)  # [B, T]
        context = F.linear(s, w_s).view(b, beams, -1)
        return context + placeholder[:, None]

    def transition(self, level: int, s: Tensor | None, codes: Tensor) -> Tensor | None:
        """s_{l+1} from s_l and the chosen level-`level` codes [N] (0-based level)."""
        if not self.config.use_context:
            return None
        e = self.code_embed[level](codes)
        if self.config.transition == "add":
            return s + e
        return self.rnn[level](e, s)

    def forward(self, states: Tensor, codes: Tensor) -> list[Tensor]:
        """Teacher forcing (Algorithm 3 lines 3-8): per-level logits, transitions on the true codes."""
        return teacher_forced_logits(self, states, codes)


class MTPHead(nn.Module):
    """Multi-token prediction: L independent linear heads on the last hidden state h_0."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.config = cfg
        self.logit = nn.ModuleList(nn.Linear(cfg.dim, t) for t in cfg.codebook_sizes)

    def init_state(self, states: Tensor) -> None:
        return None

    def level_logits(self, level: int, states: Tensor, s: None) -> Tensor:
        return self.logit[level](states[:, 0])

    def beam_logits(self, level: int, states: Tensor, s: None, beams: int) -> Tensor:
        """[B, beams, T]: the heads read only h_0, so every beam of a user gets the same logits."""
        return self.level_logits(level, states, s)[:, None].expand(-1, beams, -1)

    def transition(self, level: int, s: None, codes: Tensor) -> None:
        return None

    def forward(self, states: Tensor, codes: Tensor) -> list[Tensor]:
        return teacher_forced_logits(self, states, codes)


DraftHead = NezhaHead | MTPHead


def build_head(cfg: HeadConfig) -> DraftHead:
    return NezhaHead(cfg) if cfg.kind == "nezha" else MTPHead(cfg)


def teacher_forced_logits(head: DraftHead, states: Tensor, codes: Tensor) -> list[Tensor]:
    s = head.init_state(states)
    out = []
    for level in range(head.config.levels):
        out.append(head.level_logits(level, states, s))
        if level < head.config.levels - 1:
            s = head.transition(level, s, codes[:, level])
    return out


def head_level_losses(head: DraftHead, states: Tensor, codes: Tensor) -> Tensor:
    """[L]: each level's cross-entropy of the true code (teacher forcing), averaged over examples."""
    logits = head(states, codes)
    return torch.stack([F.cross_entropy(lg.float(), codes[:, l]) for l, lg in enumerate(logits)])


def sid_log_prob(head: DraftHead, states: Tensor, codes: Tensor) -> Tensor:
    """log p(SID) under the head, [N] for codes [N, L] (the exhaustive-search reference)."""
    logits = head(states, codes)
    return sum(
        torch.log_softmax(lg.float(), -1).gather(1, codes[:, l : l + 1])[:, 0] for l, lg in enumerate(logits)
    )


# --- prompts and states ------------------------------------------------------------------------------
def append_placeholders(tokens: Tensor, mask: Tensor, placeholders: list[int]) -> tuple[Tensor, Tensor]:
    """Left-padded prompts [B, S] -> [B, S + L] ending with <SP_1>..<SP_L> (every row real there)."""
    b = tokens.shape[0]
    sp = torch.as_tensor(placeholders, dtype=tokens.dtype, device=tokens.device).expand(b, -1)
    ones = torch.ones(b, len(placeholders), dtype=torch.bool, device=mask.device)
    return torch.cat([tokens, sp], dim=1), torch.cat([mask, ones], dim=1)


def head_states(hidden: Tensor, cfg: HeadConfig) -> Tensor:
    """The head's input states from final hidden states [B, S, D] of a prompt built for `cfg`.

    With placeholders: [B, L+1, D] = (h_0, h_1..h_L); without: [B, 1, D] = h_0 (the last position).
    """
    return hidden[:, -(cfg.levels + 1) :] if cfg.needs_placeholders else hidden[:, -1:]


# --- checkpoint tensors ----------------------------------------------------------------------------
def head_state_dict(head: DraftHead) -> dict[str, Tensor]:
    return {HEAD_PREFIX + k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}


def split_head_tensors(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(backbone tensors, head tensors with the prefix removed)."""
    head = {k[len(HEAD_PREFIX) :]: v for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    rest = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIX)}
    return rest, head
