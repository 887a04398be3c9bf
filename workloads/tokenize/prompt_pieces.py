"""A prompt's token ids assembled from pieces tokenised once: the fast path of `PromptEncoder`.

A tokenizer cuts its added tokens (the SID tokens) out of the text before it normalises or splits
anything, so the text between two SID tokens is tokenised on its own. A rendered prompt is such text
pieces with the history's SID strings between them: the lead (before the first item's SID), a joint
between consecutive items, and the tail. Each piece is tokenised once, in context (between SID tokens,
as it stands in a prompt, so a rule such as "prepend a space to the first word of the input" sees what it
sees there), and a prompt's ids are the pieces' ids with the items' SID token ids from the table
between them: no tokenizer call per prompt, which was two thirds of an imported decode's prompt time.

That composition is checked, not assumed. `PromptPieces.build` returns None (every prompt is then
tokenised whole, as before) unless: every SID string is one token, the table's id, in context; no piece
holds a SID token; and the assembled ids of sample histories of one, two and three items equal the
tokenizer's own encoding of their rendered prompts. A template with `{index}` has a joint per position:
each is made (and kept) on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from genrec.workloads.sid_table import NO_TOKEN, SIDTokenTable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

    from genrec.workloads.tokenize.prompt_template import PromptTemplate

MARK = "\x00"  # stands for an item's SID string while a template is cut into its pieces
CHECKED_LENGTHS = (1, 2, 3)  # histories (items) whose assembled ids must equal the tokenizer's


class NotComposable(Exception):
    """The tokenizer does not tokenise this template piece by piece (the whole-prompt path is used)."""


@dataclass
class PromptPieces:
    template: PromptTemplate
    tokenizer: Tokenizer
    table: SIDTokenTable
    sid_strings: list[list[str]]  # [level][code] -> the SID token's string
    head: list[int] = field(default_factory=list)  # specials the tokenizer adds before the text
    foot: list[int] = field(default_factory=list)  # ... and after it
    _joints: dict[int, list[int]] = field(default_factory=dict)  # k -> ids between item k and k + 1
    _tails: dict[int, list[int]] = field(default_factory=dict)  # n -> ids after the last of n items
    _lead: list[int] | None = None

    @classmethod
    def build(
        cls,
        template: PromptTemplate,
        tokenizer: Tokenizer,
        table: SIDTokenTable,
        sid_strings: list[list[str]],
    ) -> PromptPieces | None:
        """The pieces of `template` for this tokenizer, or None where composing them would not give the
        tokenizer's own ids (see the module doc)."""
        pieces = cls(template, tokenizer, table, sid_strings)
        try:
            pieces._check_sid_strings()
            pieces.head, pieces.foot = pieces._specials()
            for n in CHECKED_LENGTHS[: template.max_history or len(CHECKED_LENGTHS)]:
                codes = sample_codes(table, n)
                text = template.render_strings(
                    [[sid_strings[lv][c] for lv, c in enumerate(r)] for r in codes]
                )
                whole = tokenizer.encode(text, add_special_tokens=template.add_special_tokens).ids
                if pieces.ids(codes) != whole:
                    raise NotComposable(f"{n} items: assembled ids differ from the tokenizer's")
        except NotComposable:
            return None
        return pieces

    def ids(self, codes: np.ndarray) -> list[int]:
        """Token ids of the prompt of [n, L] item codes (oldest first; already cut to max_history)."""
        sids = self.table.codes_to_tokens(codes).tolist()
        out = self.head + self.lead
        for k, row in enumerate(sids, start=1):
            out += row
            out += self.joint(k) if k < len(sids) else self.tail(k)
        return out + self.foot

    # --- the pieces, tokenised in context ------------------------------------------------------------
    @property
    def lead(self) -> list[int]:
        if self._lead is None:
            self._lead = self._in_context(self._texts(1)[0], before=False, after=True)
        return self._lead

    def joint(self, k: int) -> list[int]:
        """Ids between item k and item k + 1 (1-based); one for all k unless the item has `{index}`."""
        key = k if "{index}" in self.template.item else 1
        if key not in self._joints:
            self._joints[key] = self._in_context(self._texts(key + 1)[key], before=True, after=True)
        return self._joints[key]

    def tail(self, n: int) -> list[int]:
        key = n if "{index}" in self.template.item else 1
        if key not in self._tails:
            self._tails[key] = self._in_context(self._texts(key)[key], before=True, after=False)
        return self._tails[key]

    def _texts(self, n: int) -> list[str]:
        """The text pieces of a prompt of n items: lead, n - 1 joints, tail."""
        return self.template.render_strings([[MARK]] * n).split(MARK)

    def _in_context(self, text: str, before: bool, after: bool) -> list[int]:
        """Ids of `text` tokenised where it stands in a prompt: after an item's last SID token (`before`)
        and/or before an item's first (`after`)."""
        (last, last_id), (first, first_id) = self._context_sid(-1), self._context_sid(0)
        ids = self.tokenizer.encode(last * before + text + first * after, add_special_tokens=False).ids
        lo, hi = int(before), len(ids) - int(after)
        if (before and ids[:1] != [last_id]) or (after and ids[-1:] != [first_id]) or hi < lo:
            raise NotComposable(f"the SID token next to {text!r} is not kept whole")
        piece = ids[lo:hi]
        if (self.table.level_of_token(np.asarray(piece, dtype=np.int64)) >= 0).any():
            raise NotComposable(f"template text {text!r} holds a SID token")
        return piece

    def _context_sid(self, level: int) -> tuple[str, int]:
        """A SID token (string, id) of `level` to stand beside a piece: its first code with a token."""
        code = next(c for c, t in enumerate(self.table.ids[level]) if t != NO_TOKEN)
        return self.sid_strings[level][code], self.table.ids[level][code]

    def _check_sid_strings(self) -> None:
        """Every SID string (of a code with a token), written between others, is one token: the table's."""
        pairs = [
            (s, t) for strings, ids in zip(self.sid_strings, self.table.ids) for s, t in zip(strings, ids)
        ]
        pairs = [(s, t) for s, t in pairs if t != NO_TOKEN]
        got = self.tokenizer.encode("".join(s for s, _ in pairs), add_special_tokens=False).ids
        if got != [t for _, t in pairs]:
            raise NotComposable("a SID string is not one token of the table")

    def _specials(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer adds around a text (a LLaMA tokenizer's BOS), when the template asks."""
        if not self.template.add_special_tokens:
            return [], []
        text = self._context_sid(0)[0]
        plain = self.tokenizer.encode(text, add_special_tokens=False).ids
        full = self.tokenizer.encode(text, add_special_tokens=True).ids
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i], full[i + len(plain) :]
        raise NotComposable("the tokenizer's special tokens are not a prefix and a suffix")


def sample_codes(table: SIDTokenTable, n: int) -> np.ndarray:
    """[n, L] codes with tokens, spread over each level's range: the histories a check assembles."""
    present = [[c for c, t in enumerate(level) if t != NO_TOKEN] for level in table.ids]
    return np.array(
        [[codes[(7 * k + 3 * lv) % len(codes)] for lv, codes in enumerate(present)] for k in range(n)]
    )
