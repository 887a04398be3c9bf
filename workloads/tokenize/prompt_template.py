"""The prompt an imported checkpoint was fine-tuned with: a small typed template, tokenised by its tokenizer.

LC-Rec-style GR checkpoints are instruction-tuned causal LMs: the prompt is an instruction text in which
the user's history appears as SID token strings (`<a_3><b_17><c_5>, <a_9>...`), followed by a response
marker after which the model writes the next item's SID. A `PromptTemplate` holds that prompt:

- `text`            the instruction, with one `{history}` placeholder;
- `item`            how one history item is written: `{sid}` (its tokens written together) and optionally
                    `{index}` (1-based position, for prompts that number the items);
- `separator`       between history items;
- `system`, `response_prefix`  literal text before and after the instruction (braces kept as written);
- `max_history`     keep only the most recent items (None: all);
- `add_special_tokens`  let the tokenizer add its own specials (a LLaMA tokenizer's BOS).

It is stored with the imported model as JSON and rendered, then tokenised with the checkpoint's own
`tokenizer.json` (the `tokenizers` library, offline). A template that does not render (no `{history}`,
an unknown field, a stray brace) or a stored form with unknown keys is a one-line UserInputError. Our own
models do not use this: their prompt stays BOS + the history's SID tokens.
"""

from __future__ import annotations

import json
import os
import string
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.tokenize.prompt_pieces import PromptPieces
from genrec.workloads.tokenize.sid_tokens import SIDPattern

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

TEMPLATE_FILE = "prompt_template.json"


def _field_names(what: str, text: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:  # a single '{' or '}'
        raise UserInputError(
            f"prompt template {what} {text[:60]!r}: {e}; write a literal brace as {{{{ or }}}}"
        ) from None


@dataclass(frozen=True)
class PromptTemplate:
    text: str
    item: str = "{sid}"
    separator: str = ", "
    system: str = ""
    response_prefix: str = ""
    max_history: int | None = None
    add_special_tokens: bool = True

    def __post_init__(self) -> None:
        names = _field_names("text", self.text)
        unknown = sorted(set(names) - {"history"})
        if unknown or names.count("history") != 1:
            problem = (
                f"unknown field {{{unknown[0]}}}" if unknown else "needs exactly one {history} placeholder"
            )
            raise UserInputError(
                f"prompt template text {problem}; the text takes only {{history}} (write literal braces as "
                "{{ and }})"
            )
        names = _field_names("item", self.item)
        if set(names) - {"sid", "index"} or names.count("sid") != 1:
            raise UserInputError(
                f"prompt template item {self.item!r} must contain {{sid}} once and may contain {{index}}, "
                "nothing else"
            )
        if self.max_history is not None and self.max_history < 1:
            raise UserInputError(f"prompt template max_history must be >= 1 or null, got {self.max_history}")
        self.render_strings([["<x>"]])  # a format spec the fields cannot take fails here, not at serving

    # --- rendering ----------------------------------------------------------------------------
    def render_strings(self, history: list[list[str]]) -> str:
        """The prompt for a history given as SID token strings per item (oldest first)."""
        if self.max_history is not None:
            history = history[-self.max_history :]
        try:
            items = [self.item.format(sid="".join(tokens), index=k + 1) for k, tokens in enumerate(history)]
            body = self.text.format(history=self.separator.join(items))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise UserInputError(
                f"prompt template does not render ({e}); use plain {{history}} / {{sid}}"
            ) from None
        return self.system + body + self.response_prefix

    def render(self, history_codes: np.ndarray, pattern: SIDPattern) -> str:
        """The prompt for a history given as [n, L] codes, its tokens spelled by the SID pattern."""
        codes = np.asarray(history_codes, dtype=np.int64).reshape(-1, np.shape(history_codes)[-1])
        return self.render_strings([[pattern.token(l, int(c)) for l, c in enumerate(row)] for row in codes])

    # --- storage ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PromptTemplate:
        known = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or "text" not in d or set(d) - known:
            extra = sorted(set(d) - known) if isinstance(d, dict) else []
            raise UserInputError(
                f"prompt template: {'unknown keys ' + str(extra) if extra else 'needs a text'}; "
                f"the keys are {sorted(known)}"
            )
        return cls(**d)

    def save(self, folder: str | os.PathLike) -> Path:
        """Write `prompt_template.json` into the folder (temporary file, then rename)."""
        path = Path(folder) / TEMPLATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> PromptTemplate:
        """From a JSON file, or a folder holding `prompt_template.json`."""
        p = Path(path)
        p = p / TEMPLATE_FILE if p.is_dir() else p
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserInputError(f"{p}: no prompt template; write one (text with {{history}})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserInputError(f"{p}: not a JSON prompt template ({e}); fix the file") from None
        return cls.from_dict(raw)


@dataclass(frozen=True)
class PromptEncoder:
    """Histories -> prompt token ids with the checkpoint's tokenizer, checked against its SID table."""

    template: PromptTemplate
    tokenizer: Tokenizer
    pattern: SIDPattern
    table: SIDTokenTable

    def encode(self, history_codes: np.ndarray) -> list[int]:
        """Token ids of one user's prompt; history_codes is [n, L], oldest item first."""
        return self.encode_batch([history_codes])[0]

    def encode_batch(self, histories: list[np.ndarray]) -> list[list[int]]:
        """Token ids of each history's prompt. Where the tokenizer composes (prompt_pieces.py), assembled
        from the template's pieces tokenised once; otherwise rendered with the SID strings spelled once,
        tokenised whole and checked in one pass over the batch."""
        codes = [self._recent(h) for h in histories]
        if self._pieces is not None:  # the template's pieces tokenised once (prompt_pieces.py)
            return [self._pieces.ids(c) for c in codes]
        spell = self._sid_strings
        texts = [
            self.template.render_strings([[spell[lv][c] for lv, c in enumerate(row)] for row in c.tolist()])
            for c in codes
        ]
        special = self.template.add_special_tokens
        # one encode per text: encode_batch's thread pool would compete with torch's threads and make
        # tokenizers warn in every process forked after it
        ids = [self.tokenizer.encode(t, add_special_tokens=special).ids for t in texts]
        self._check_sid_tokens(ids, codes)
        return ids

    def _recent(self, history_codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(history_codes, dtype=np.int64).reshape(-1, self.table.levels)
        return codes if self.template.max_history is None else codes[-self.template.max_history :]

    @cached_property
    def _sid_strings(self) -> list[list[str]]:
        """Each level's token strings by code, spelled once by the pattern."""
        return [
            [self.pattern.token(lv, c) for c in range(n)] for lv, n in enumerate(self.table.codebook_sizes)
        ]

    @cached_property
    def _pieces(self) -> PromptPieces | None:
        return PromptPieces.build(self.template, self.tokenizer, self.table, self._sid_strings)

    def _check_sid_tokens(self, ids: list[list[int]], codes: list[np.ndarray]) -> None:
        """Each prompt's SID token ids must be exactly its history's, in order (each string one token):
        the batch's SID ids in order equal the histories' and every prompt holds its own count."""
        flat = np.fromiter((t for row in ids for t in row), dtype=np.int64)
        is_sid = self.table.level_of_token(flat) >= 0
        in_prompt = flat[is_sid]
        want = np.asarray(self.table.codes_to_tokens(np.concatenate(codes))).reshape(-1)
        owner = np.repeat(np.arange(len(ids)), [len(row) for row in ids])
        per_prompt = np.bincount(owner[is_sid], minlength=len(ids))
        counts_ok = all(n == c.size for n, c in zip(per_prompt.tolist(), codes))
        if not (counts_ok and np.array_equal(in_prompt, want)):
            raise UserInputError(
                f"the tokenizer turned the history's {want.size} SID tokens into {in_prompt.size} SID token "
                "ids (other text of the template contains SID tokens, or the tokenizer splits them); use the "
                "checkpoint's tokenizer.json, whose SID tokens are added tokens, and a template without SIDs"
            )
