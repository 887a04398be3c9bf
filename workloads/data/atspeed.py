"""Import the AtSpeed / LC-Rec preprocessed format into a dataset folder.

Source folder:
    sequential_train.txt, sequential_valid.txt, sequential_test.txt
        one line per user, `USER ITEM ITEM ...`, whitespace separated, 1-based ids, time order;
        a line with only the user id means "no interactions in this split".
    *.json  item index: 0-based item id (string) -> L tokens "<a_N>", "<b_N>", ... (level letter, code)

Mapping: txt item i -> item_id i - 1 (so item ids stay aligned with the index keys); users are
dense in order of their numeric source id; `source_id` keeps the 1-based txt item id. The shipped
temporal split is kept: positions continue across train -> valid -> test for each user. Users with
no interaction in any split are dropped. SID collisions get an explicit disambiguation level.
Everything is parsed and validated before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from genrec.workloads.data.dataset import (
    SPLITS,
    DatasetError,
    Manifest,
    interactions_table,
    items_table,
    split_counts,
    write_dataset,
)
from genrec.workloads.sid_codec import codebook_utilisation, ensure_unique_sids

IMPORTER_VERSION = "1"
SPLIT_FILES = {s: f"sequential_{s}.txt" for s in SPLITS}
TOKEN_RE = re.compile(r"^<([a-z])_(\d+)>$")
FORMAT_HINT = "each line must be `USER ITEM ITEM ...` with positive integer ids (1-based)"


@dataclass
class SplitLines:
    """One split file, parsed: per user (1-based source id) the item ids in order, and the line numbers."""

    path: Path
    items: dict[int, list[int]]
    lines: dict[int, int]


# --- parsing ---------------------------------------------------------------------------------------
def parse_split_file(path: Path) -> SplitLines:
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing; an AtSpeed/LC-Rec folder needs {', '.join(SPLIT_FILES.values())} "
            "and one item index *.json"
        )
    items: dict[int, list[int]] = {}
    lines: dict[int, int] = {}
    with path.open("rb") as f:  # bytes: a non-UTF-8 byte is reported with its line, not as a traceback
        for lineno, raw in enumerate(f, start=1):
            fields = _decode_line(path, lineno, raw).split()
            if not fields:
                continue  # blank lines (e.g. a trailing newline) carry no user
            try:
                ids = [int(x) for x in fields]
            except ValueError:
                tok = next(x for x in fields if not _is_int(x))
                raise DatasetError(f"{path}:{lineno}: {tok!r} is not an integer; {FORMAT_HINT}") from None
            if min(ids) < 1:
                raise DatasetError(f"{path}:{lineno}: id {min(ids)} is < 1; {FORMAT_HINT}")
            user = ids[0]
            if user in lines:
                raise DatasetError(
                    f"{path}:{lineno}: user {user} already appeared on line {lines[user]}; "
                    "merge the two lines (one line per user)"
                )
            items[user], lines[user] = ids[1:], lineno
    if not lines:
        raise DatasetError(f"{path}: empty file (no user lines); {FORMAT_HINT}")
    return SplitLines(path, items, lines)


def _decode_line(path: Path, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}:{lineno}: byte {raw[e.start]:#04x} at column {e.start + 1} is not UTF-8 text; "
            f"{FORMAT_HINT} (re-export the file as UTF-8 or remove the stray byte)"
        ) from None


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def find_index_file(folder: Path, index: str | os.PathLike | None = None) -> Path:
    """The item index: `index` if given, else the single *.json in the folder that looks like one."""
    if index is not None:
        path = Path(index)
        if not path.is_file():
            raise DatasetError(f"{path}: index file not found; pass an existing *.json with --index")
        return path
    candidates = sorted(p for p in folder.glob("*.json") if _looks_like_index(p))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise DatasetError(
            f'{folder}: no item index *.json (0-based item id -> list of tokens like "<a_12>"); '
            "add it to the folder or pass --index FILE"
        )
    names = ", ".join(p.name for p in candidates)
    raise DatasetError(f"{folder}: several item index files ({names}); choose one with --index FILE")


def _looks_like_index(path: Path) -> bool:
    """Cheap sniff: a JSON object whose first value is a list of '<x_N>'-like strings."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:  # a sniff: never fail on bytes
            head = f.read(4096)
    except OSError:
        return False
    return re.match(r'\s*\{\s*"[^"]*"\s*:\s*\[\s*"<', head) is not None


def parse_index(path: Path) -> np.ndarray:
    """Index JSON -> [N, L] int64 codes, row k = item with key str(k); keys must be 0..N-1."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: byte {e.start} is not UTF-8 text; the index must be one UTF-8 JSON object"
        ) from None
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg}); the index must be one JSON object"
        ) from e
    if not isinstance(raw, dict) or not raw:
        raise DatasetError(f'{path}: the index must be a non-empty JSON object {{"0": ["<a_1>", ...], ...}}')
    n = len(raw)
    levels: int | None = None
    codes: np.ndarray | None = None
    seen = np.zeros(n, dtype=bool)
    for key, tokens in raw.items():
        if not (key.isdigit() and key == str(int(key)) and int(key) < n):
            raise DatasetError(
                f"{path}: key {key!r} is not an item id in 0..{n - 1}; keys must be the 0-based item ids "
                "0..N-1 as strings"
            )
        if not isinstance(tokens, list) or not tokens:
            raise DatasetError(f'{path}: key {key!r}: value must be a non-empty list of tokens like "<a_12>"')
        if levels is None:
            levels = len(tokens)
            codes = np.empty((n, levels), dtype=np.int64)
        if len(tokens) != levels:
            raise DatasetError(
                f"{path}: key {key!r} has {len(tokens)} tokens, other items have {levels}; every item needs "
                "one token per level"
            )
        assert codes is not None
        codes[int(key)] = [_parse_token(path, key, level, tok) for level, tok in enumerate(tokens)]
        seen[int(key)] = True
    if not seen.all():  # duplicate keys in JSON collapse, so len(raw) can only hide gaps here
        missing = int(np.flatnonzero(~seen)[0])
        raise DatasetError(f"{path}: key {str(missing)!r} is missing; keys must be 0..{n - 1}")
    assert codes is not None
    return codes


def _parse_token(path: Path, key: str, level: int, token: object) -> int:
    m = TOKEN_RE.match(token) if isinstance(token, str) else None
    want = chr(ord("a") + level)
    if m is None or m.group(1) != want:
        raise DatasetError(
            f'{path}: key {key!r}: token {level + 1} is {token!r}, expected "<{want}_N>" '
            f"(level letter {want!r}, non-negative code N)"
        )
    return int(m.group(2))


# --- assembling ----------------------------------------------------------------------------------
def build_interactions(
    splits: dict[str, SplitLines], num_items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(users, items, positions, split) arrays, positions continuing train -> valid -> test."""
    for s in SPLITS:  # every item id must be in the index, checked with the line that uses it
        for user, seq in splits[s].items.items():
            if seq and max(seq) > num_items:
                bad = next(i for i in seq if i > num_items)
                raise DatasetError(
                    f"{splits[s].path}:{splits[s].lines[user]}: item {bad} is not in the index "
                    f"(index key {str(bad - 1)!r}; the index has keys 0..{num_items - 1}); "
                    "use the index file that belongs to these sequences"
                )
    active = sorted({u for s in SPLITS for u, seq in splits[s].items.items() if seq})
    dense = {u: k for k, u in enumerate(active)}
    users, items, positions, split_col = [], [], [], []
    for u in active:
        pos = 0
        for s in SPLITS:
            seq = splits[s].items.get(u, [])
            users.extend([dense[u]] * len(seq))
            items.extend(seq)
            positions.extend(range(pos, pos + len(seq)))
            split_col.extend([s] * len(seq))
            pos += len(seq)
    item_ids = np.asarray(items, dtype=np.int64) - 1  # 1-based txt id -> 0-based index key
    return (
        np.asarray(users, dtype=np.int64),
        item_ids,
        np.asarray(positions, dtype=np.int64),
        np.asarray(split_col, dtype=object),
        len(active),
    )


def codebook_sizes_for(codes: np.ndarray, codebook_size: int | None, index_path: Path) -> tuple[int, ...]:
    """Per level max code + 1, or the caller's size (e.g. 256 for LC-Rec) when it covers every code."""
    inferred = tuple(int(m) + 1 for m in codes.max(axis=0))
    if codebook_size is None:
        return inferred
    if codebook_size < max(inferred):
        raise DatasetError(
            f"{index_path}: codebook size {codebook_size} is too small, the index uses codes up to "
            f"{max(inferred) - 1}; pass --codebook-size >= {max(inferred)} or leave it out to infer it"
        )
    return (int(codebook_size),) * codes.shape[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_atspeed(
    path: str | os.PathLike,
    name: str | None = None,
    index: str | os.PathLike | None = None,
    codebook_size: int | None = None,
) -> tuple[Manifest, pa.Table, pa.Table]:
    """Parse and validate the folder; returns (manifest, interactions, items) without writing."""
    folder = Path(path)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such folder; pass the AtSpeed/LC-Rec data folder with --path")
    splits = {s: parse_split_file(folder / f) for s, f in SPLIT_FILES.items()}
    index_path = find_index_file(folder, index)
    source_codes = parse_index(index_path)
    num_items = len(source_codes)
    users, items, positions, split_col, num_users = build_interactions(splits, num_items)
    sizes = codebook_sizes_for(source_codes, codebook_size, index_path)
    codes, sizes, sid_stats = ensure_unique_sids(source_codes, sizes)
    sid_stats["source_levels"] = int(source_codes.shape[1])
    sid_stats["codebook_size_source"] = "inferred (max code + 1)" if codebook_size is None else "given"
    sid_stats["utilisation"] = codebook_utilisation(codes, sizes)
    files = [folder / f for f in SPLIT_FILES.values()] + [index_path]
    manifest = Manifest(
        name=name or folder.resolve().name,
        codebook_sizes=list(sizes),
        num_users=num_users,
        num_items=num_items,
        counts=split_counts(split_col),
        split_rule="temporal",
        provenance={
            "importer": "atspeed",
            "version": IMPORTER_VERSION,
            "source": str(folder.resolve()),
            "index_file": index_path.name,
            "split_note": "kept as shipped (global temporal 8:1:1 by the source)",
            "item_id_rule": "txt item i (1-based) -> item_id i-1 = index key; source_id = i",
            "user_id_rule": "dense in numeric source-id order; users without interactions dropped",
            "sha256": {p.name: _sha256(p) for p in files},
        },
        sid_stats=sid_stats,
    )
    source_ids = [str(i + 1) for i in range(num_items)]
    return manifest, interactions_table(users, items, positions, split_col), items_table(codes, source_ids)


def import_atspeed(
    path: str | os.PathLike,
    out: str | os.PathLike,
    overwrite: bool = False,
    name: str | None = None,
    index: str | os.PathLike | None = None,
    codebook_size: int | None = None,
) -> tuple[Path, Manifest]:
    """Import the folder at `path` into the dataset folder `out` (atomic); returns (out, manifest)."""
    manifest, interactions, items = build_atspeed(path, name=name, index=index, codebook_size=codebook_size)
    return write_dataset(out, manifest, interactions, items, overwrite=overwrite), manifest
