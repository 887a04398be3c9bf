"""Tokenizers with SID tokens, built in the test with the `tokenizers` library (no network, no download)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "the", "user", "bought", "items", "next", "item", ":", ",", "."]


def lcrec_token_strings(sizes: tuple[int, ...], template: str = "<{level}_{code}>") -> list[str]:
    """Every (level, code) token, sorted as strings, as LC-Rec adds them (`<a_10>` before `<a_2>`)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted(template.format(level=letters[l], code=c) for l, t in enumerate(sizes) for c in range(t))


def word_tokenizer(sid_tokens: list[str], words: list[str] = WORDS, bos: bool = True) -> Tokenizer:
    """A WordLevel tokenizer on `words` (whitespace/punctuation split) with `sid_tokens` added after them,
    in the given order; with `bos`, encoding prepends <s> as LLaMA's tokenizer does."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    split = [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.add_special_tokens([AddedToken(w, special=True) for w in ("<s>", "</s>", "<pad>")])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_tokens([AddedToken(t, normalized=False) for t in sid_tokens])
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder
