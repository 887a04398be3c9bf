"""Find a checkpoint's SID tokens in its tokenizer and build the (level, code) -> token-id table.

A GR checkpoint in Hugging Face form extends a causal LM's vocabulary with one token per (level, code)
(`tokenizer.add_tokens`). The names differ by framework; a `SIDPattern` says how they are spelled:

- `lcrec`       `<a_N>`, `<b_N>`, `<c_N>`, `<d_N>` (LC-Rec, AtSpeed; level = letter, a = level 0)
- `openonerec`  `<s_a_N>`, `<s_b_N>`, `<s_c_N>`
- a custom spec: one template with `{level}` (a lowercase letter, a = level 0) and `{code}`, e.g.
  `<item_{level}{code}>`, or one template per level, each with `{code}`, separated by spaces, e.g.
  `<x{code}> <y{code}> <z{code}>`.

A code is written in decimal without leading zeros. The tokenizer is read with the `tokenizers`
library from `tokenizer.json` (offline). Every token of the vocabulary, added or not, is matched, and
the token ids are taken as they are: LC-Rec adds its tokens sorted as strings, so `<a_10>` comes before
`<a_2>`; the table records that, nothing here assumes an order.

Gaps: LC-Rec adds only the tokens that some item uses, so a level may lack codes (the Beauty index uses
91 of 256 first-level codes); the `lcrec` preset allows that (a gap code is never generated, see
sid_table.py). Other patterns refuse gaps unless `allow_gaps` is passed.

Errors are one-line `UserInputError`s naming the problem and the fix: no SID token in the tokenizer,
a level whose codes have gaps (where not allowed), tokenizer ids beyond the model's vocabulary.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_table import NO_TOKEN, SIDTokenTable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

PRESETS: dict[str, tuple[str, ...]] = {
    "lcrec": ("<{level}_{code}>",),
    "openonerec": ("<s_{level}_{code}>",),
}
GAPS_ALLOWED = {"lcrec"}  # frameworks that add only the codes items use
LEVEL_LETTERS = string.ascii_lowercase
_CODE_RE = "(?P<code>0|[1-9][0-9]*)"
_LEVEL_RE = "(?P<level>[a-z])"
PATTERN_HINT = (
    f"use a preset ({', '.join(PRESETS)}) or templates with {{code}} (and {{level}} for a letter a, b, ...)"
)


@dataclass(frozen=True)
class SIDPattern:
    """How SID tokens are spelled: one template with {level} and {code}, or one template per level."""

    templates: tuple[str, ...]
    name: str = "custom"
    allow_gaps: bool = False  # a level may lack codes (no item uses them): they are never generated

    def __post_init__(self) -> None:
        templates = tuple(self.templates)
        if not templates:
            raise UserInputError(f"SID pattern {self.name!r} has no template; {PATTERN_HINT}")
        for t in templates:
            fields = _fields(t)
            allowed = {"code", "level"} if len(templates) == 1 else {"code"}
            if fields.count("code") != 1 or set(fields) - allowed or fields.count("level") > 1:
                raise UserInputError(
                    f"SID token template {t!r} must contain {{code}} once and no field but "
                    f"{' and '.join('{' + f + '}' for f in sorted(allowed))}; {PATTERN_HINT}"
                )
        object.__setattr__(self, "templates", templates)

    @property
    def lettered(self) -> bool:
        """True when the level is spelled as a letter inside one template."""
        return len(self.templates) == 1 and "level" in _fields(self.templates[0])

    def regexes(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(_to_regex(t)) for t in self.templates)

    def token(self, level: int, code: int) -> str:
        """The token string of (level, code)."""
        if self.lettered:
            return self.templates[0].format(level=LEVEL_LETTERS[level], code=code)
        if len(self.templates) == 1:
            return self.templates[0].format(code=code)
        return self.templates[level].format(code=code)

    def to_dict(self) -> dict:
        return {"name": self.name, "templates": list(self.templates), "allow_gaps": self.allow_gaps}

    @classmethod
    def from_dict(cls, d: Mapping) -> SIDPattern:
        return cls(tuple(d["templates"]), str(d.get("name", "custom")), bool(d.get("allow_gaps", False)))


def _fields(template: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:  # an unbalanced brace
        raise UserInputError(f"SID token template {template!r}: {e}; {PATTERN_HINT}") from None


def _to_regex(template: str) -> str:
    parts = []
    for literal, f, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if f is not None:
            parts.append(_CODE_RE if f == "code" else _LEVEL_RE)
    return "".join(parts)


def sid_pattern(spec: str | SIDPattern, allow_gaps: bool | None = None) -> SIDPattern:
    """A preset name (`lcrec`, `openonerec`) or a custom spec (templates separated by spaces);
    `allow_gaps` overrides the preset's gap rule (None keeps it)."""
    if isinstance(spec, SIDPattern):
        pattern = spec
    elif spec in PRESETS:
        pattern = SIDPattern(PRESETS[spec], spec, spec in GAPS_ALLOWED)
    else:
        templates = tuple(spec.split())
        if not templates or not any("{" in t for t in templates):
            raise UserInputError(f"unknown SID pattern {spec!r}; {PATTERN_HINT}")
        pattern = SIDPattern(templates)
    if allow_gaps is None or allow_gaps == pattern.allow_gaps:
        return pattern
    return SIDPattern(pattern.templates, pattern.name, allow_gaps)


def match_sid_token(pattern: SIDPattern, regexes: tuple[re.Pattern[str], ...], token: str) -> list[tuple]:
    """Every (level, code) the token spells (more than one only for overlapping per-level templates)."""
    hits = []
    for level, rx in enumerate(regexes):
        m = rx.fullmatch(token)
        if m is not None:
            lv = LEVEL_LETTERS.index(m.group("level")) if pattern.lettered else level
            hits.append((lv, int(m.group("code"))))
    return hits


def sid_tokens_in_vocab(vocab: Mapping[str, int], pattern: SIDPattern, where: str) -> dict[tuple, int]:
    """{(level, code): token id} for every vocabulary entry the pattern matches."""
    regexes = pattern.regexes()
    found: dict[tuple[int, int], int] = {}
    for token, tid in vocab.items():
        hits = match_sid_token(pattern, regexes, token)
        if len(hits) > 1:
            raise UserInputError(
                f"{where}: token {token!r} matches several SID levels of pattern {pattern.templates}; "
                "make the per-level templates distinct"
            )
        if hits:
            found[hits[0]] = int(tid)
    if not found:
        shown = 3 if pattern.lettered else min(3, len(pattern.templates))
        spelled = ", ".join(pattern.token(lv, 0) for lv in range(shown))
        raise UserInputError(
            f"{where}: no SID tokens found (pattern {pattern.name!r}: {spelled}, ...); pass the tokenizer "
            f"the checkpoint was fine-tuned with, or the pattern its SID tokens use ({PATTERN_HINT})"
        )
    return found


def table_from_found(
    found: Mapping[tuple, int], vocab_size: int, where: str, allow_gaps: bool = False
) -> SIDTokenTable:
    """The table, refusing a missing level, and a missing code (a gap) unless gaps are allowed."""
    levels = sorted({lv for lv, _ in found})
    if levels != list(range(len(levels))):
        missing = min(set(range(max(levels) + 1)) - set(levels))
        raise UserInputError(
            f"{where}: SID tokens exist for levels {levels} but not level {missing}; every level from 0 "
            "needs its tokens (check the SID pattern)"
        )
    ids = []
    for lv in levels:
        codes = sorted(c for level, c in found if level == lv)
        if codes != list(range(len(codes))) and not allow_gaps:
            gaps = sorted(set(range(codes[-1] + 1)) - set(codes))
            more = f" (and {len(gaps) - 1} more)" if len(gaps) > 1 else ""
            raise UserInputError(
                f"{where}: level {lv} has SID tokens for codes up to {codes[-1]} but none for code "
                f"{gaps[0]}{more}; use the tokenizer the checkpoint was trained with, or allow gaps "
                "(codes no item uses; they are never generated) if its framework adds only used codes"
            )
        ids.append(tuple(found.get((lv, c), NO_TOKEN) for c in range(codes[-1] + 1)))
    return SIDTokenTable(tuple(ids), vocab_size)


# --- tokenizer files ------------------------------------------------------------------------------
def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """`tokenizer.json` (a checkpoint folder or the file itself), read offline by the tokenizers library."""
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise UserInputError(
            f"{file}: no tokenizer.json; save the checkpoint's tokenizer with it (tokenizer.save_pretrained)"
        )
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the library raises its own exception types for a malformed file
        raise UserInputError(f"{file}: not a readable tokenizer.json ({e}); re-save the tokenizer") from None


def tokenizer_size(tok: Tokenizer) -> int:
    """Ids the tokenizer can produce: max id + 1 (added tokens included)."""
    return max(tok.get_vocab(with_added_tokens=True).values()) + 1


def check_vocab_size(tok_size: int, model_vocab_size: int, where: str) -> None:
    """The model's embedding must have a row for every tokenizer id (a larger, padded one is fine)."""
    if tok_size > model_vocab_size:
        raise UserInputError(
            f"{where}: the tokenizer has ids up to {tok_size - 1} but the model's vocab_size is "
            f"{model_vocab_size}; the SID tokens were added without resizing the embeddings: use the "
            "tokenizer saved with this checkpoint (or resize_token_embeddings before saving)"
        )


def sid_table_from_tokenizer(
    tok: Tokenizer,
    pattern: str | SIDPattern = "lcrec",
    model_vocab_size: int | None = None,
    where: str = "tokenizer.json",
    allow_gaps: bool | None = None,
) -> SIDTokenTable:
    """The SID token table of a tokenizer; ids bounded by the model's vocab size when it is given;
    `allow_gaps` None follows the pattern (the lcrec preset allows gaps)."""
    size = tokenizer_size(tok)
    if model_vocab_size is not None:
        check_vocab_size(size, model_vocab_size, where)
    pat = sid_pattern(pattern, allow_gaps)
    found = sid_tokens_in_vocab(tok.get_vocab(with_added_tokens=True), pat, where)
    return table_from_found(
        found, size if model_vocab_size is None else model_vocab_size, where, pat.allow_gaps
    )


def load_sid_table(
    path: str | os.PathLike,
    pattern: str | SIDPattern = "lcrec",
    model_vocab_size: int | None = None,
    allow_gaps: bool | None = None,
) -> SIDTokenTable:
    """`sid_table_from_tokenizer` on a checkpoint folder's (or a file's) tokenizer.json."""
    tok = load_tokenizer(path)
    return sid_table_from_tokenizer(tok, pattern, model_vocab_size, str(path), allow_gaps)
