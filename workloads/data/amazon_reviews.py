"""Reading raw Amazon review and meta dumps (2014 or 2018 release) for amazon.py.

Input: one review per line with keys reviewerID, asin, overall, unixReviewTime, gzip or plain.
2018 files are strict JSON; the 2014 files are Python dict literals (single quotes), parsed with
ast.literal_eval, never eval.

Meta lines give each item field-prefixed text tokens (title words, category names and words, brand).
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from genrec.workloads.data.dataset import DatasetError

REVIEW_KEYS = ("reviewerID", "asin", "overall", "unixReviewTime")
WORD_RE = re.compile(r"[a-z0-9]+")


@dataclass
class Reviews:
    """Parsed review columns in file order."""

    users: list[str]
    items: list[str]
    ratings: np.ndarray
    times: np.ndarray


# --- reading -------------------------------------------------------------------------------------
def open_text(path: Path) -> IO[str]:
    """Open plain or gzip text (detected by the magic bytes, not the file name)."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file; pass an existing Amazon reviews/meta file")
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else path.open("r", encoding="utf-8")


def parse_record(text: str, path: Path, lineno: int) -> dict:
    """One line -> dict: strict JSON first, else a Python literal (2014 dumps), never eval."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as e:
        try:
            rec = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise DatasetError(
                f"{path}:{lineno}: neither JSON nor a Python dict literal ({e.msg} at column {e.colno}); "
                'each line must be one review object like {"reviewerID": ..., "asin": ...}'
            ) from None
    if not isinstance(rec, dict):
        raise DatasetError(f"{path}:{lineno}: a line must hold one object {{...}}, got {type(rec).__name__}")
    return rec


def iter_records(path: Path, progress: bool = False, what: str = "reviews") -> Iterator[tuple[int, dict]]:
    from tqdm import tqdm

    from genrec.workloads.progress import bar_enabled

    try:
        with open_text(path) as f:
            on = bar_enabled(progress, sys.stderr)
            bar = tqdm(f, desc=f"reading {what}", unit=" lines", file=sys.stderr, disable=not on)
            for lineno, line in enumerate(bar, start=1):
                text = line.strip()
                if text:
                    yield lineno, parse_record(text, path, lineno)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read ({e}); the file is corrupt or not UTF-8 text / gzip") from e


def read_reviews(path: Path, progress: bool = False) -> Reviews:
    users: list[str] = []
    items: list[str] = []
    ratings: list[float] = []
    times: list[int] = []
    for lineno, rec in iter_records(path, progress, "reviews"):
        missing = [k for k in REVIEW_KEYS if k not in rec]
        if missing:
            raise DatasetError(
                f"{path}:{lineno}: missing key(s) {missing}; every review needs {list(REVIEW_KEYS)} "
                "(is this a meta file passed as --reviews?)"
            )
        try:
            rating, ts = float(rec["overall"]), int(rec["unixReviewTime"])
        except (TypeError, ValueError):
            raise DatasetError(
                f"{path}:{lineno}: overall={rec['overall']!r} / unixReviewTime={rec['unixReviewTime']!r} "
                "must be a number and an integer unix time"
            ) from None
        users.append(str(rec["reviewerID"]))
        items.append(str(rec["asin"]))
        ratings.append(rating)
        times.append(ts)
    if not users:
        raise DatasetError(f"{path}: empty file (no review lines); pass an Amazon reviews JSON-lines file")
    return Reviews(users, items, np.asarray(ratings, dtype=np.float64), np.asarray(times, dtype=np.int64))


def read_meta(path: Path, progress: bool = False) -> dict[str, list[str]]:
    """asin -> field-prefixed text tokens from title, categories/category and brand."""
    tokens: dict[str, list[str]] = {}
    for lineno, rec in iter_records(path, progress, "meta"):
        if "asin" not in rec:
            raise DatasetError(f"{path}:{lineno}: missing key 'asin'; every meta line needs the item's asin")
        tokens[str(rec["asin"])] = meta_tokens(rec)
    if not tokens:
        raise DatasetError(
            f"{path}: empty file (no meta lines); pass an Amazon meta JSON-lines file or omit it"
        )
    return tokens


def meta_tokens(rec: dict) -> list[str]:
    out = [f"t:{w}" for w in WORD_RE.findall(str(rec.get("title") or "").lower())]
    cats = rec.get("categories", rec.get("category")) or []
    for cat in _flatten(cats):
        name = str(cat).strip().lower()
        out.append(f"c:{name}")  # the whole category name ...
        out.extend(f"cw:{w}" for w in WORD_RE.findall(name))  # ... and its words
    if brand := str(rec.get("brand") or "").strip().lower():
        out.append(f"b:{brand}")
    return out


def _flatten(x: object) -> Iterator[object]:
    """2014 categories are a list of lists, 2018 a flat list; a bare string counts as one."""
    if isinstance(x, list | tuple):
        for y in x:
            yield from _flatten(y)
    elif x is not None:
        yield x
