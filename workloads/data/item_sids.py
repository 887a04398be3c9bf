"""Items' semantic IDs for an imported checkpoint: item -> SID read from the file the model was trained on.

Accepted files (chosen by suffix):
- `*.json`     the LC-Rec / AtSpeed item index: {"0": ["<a_12>", "<b_3>", ...], ...}; with the `lcrec`
               pattern it is read by the existing importer's parser (data/atspeed.py), with another
               pattern by the same rules here (keys 0..N-1, one token per level, level in order);
- `*.parquet`  columns `item_id` and `sid`: a list of SID token strings, one string of tokens, or a
               list of integer codes (the form of our own items.parquet);
- `*.csv`      columns `item_id` and `sid`: the tokens of one SID in one cell, written together
               (`<a_1><b_2><c_3>`) or separated by spaces or commas.

Token strings are parsed with a `SIDPattern` (tokenize/sid_tokens.py), so the level of every token is
checked against its position. Item ids are kept as the file has them (integers or strings) and must be
unique. `check_item_codes` of the checkpoint's SID table then refuses an item whose code has no token.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from genrec.workloads.data.atspeed import parse_index
from genrec.workloads.data.dataset import DatasetError
from genrec.workloads.sid_table import SIDTokenTable
from genrec.workloads.tokenize.sid_tokens import LEVEL_LETTERS, SIDPattern, match_sid_token, sid_pattern

SEPARATORS = re.compile(r"[\s,]*")
FORMAT_HINT = "an item -> SID file is *.json (LC-Rec index), or *.parquet / *.csv with columns item_id, sid"


@dataclass(frozen=True)
class ItemSIDs:
    """`codes[i]` is the SID (one code per level) of item `item_ids[i]`, in file order."""

    item_ids: tuple[int | str, ...]
    codes: np.ndarray  # [N, L] int64
    path: str

    def check(self, table: SIDTokenTable) -> None:
        """Refuse items whose SIDs the checkpoint's tokenizer cannot spell (one-line UserInputError)."""
        table.check_item_codes(self.codes, where=self.path)


class TokenParser:
    """SID token strings -> (level, code), with a cache (a catalogue repeats at most L x T strings)."""

    def __init__(self, pattern: SIDPattern, where: str) -> None:
        self.pattern, self.where = pattern, where
        self.regexes = pattern.regexes()
        # one scanner for cells that hold several tokens: the patterns without their named groups
        plain = "|".join(re.sub(r"\(\?P<\w+>", "(?:", rx.pattern) for rx in self.regexes)
        self.scanner = re.compile(plain)
        self.cache: dict[str, tuple[int, int] | None] = {}

    def level_code(self, token: str) -> tuple[int, int] | None:
        if token not in self.cache:
            hits = match_sid_token(self.pattern, self.regexes, token)
            self.cache[token] = hits[0] if len(hits) == 1 else None
        return self.cache[token]

    def split(self, cell: str, row: str) -> list[str]:
        """The tokens of one cell, refusing anything between them but spaces and commas."""
        tokens, pos = [], 0
        for m in self.scanner.finditer(cell):
            if not SEPARATORS.fullmatch(cell, pos, m.start()):
                break
            tokens.append(m.group())
            pos = m.end()
        if not SEPARATORS.fullmatch(cell, pos):
            raise DatasetError(
                f"{self.where}: {row}: {cell[pos:][:40]!r} is no SID token of pattern {self.pattern.name!r} "
                f"({self.pattern.token(0, 0)}, ...); pass the SID pattern the file uses"
            )
        return tokens

    def codes(self, tokens: list[str], row: str) -> list[int]:
        out = []
        for position, token in enumerate(tokens):
            hit = self.level_code(token) if isinstance(token, str) else None
            if hit is None or hit[0] != position:
                levels = len(LEVEL_LETTERS) if self.pattern.lettered else len(self.pattern.templates)
                like = self.pattern.token(position, 0) if position < levels else "none (too many)"
                raise DatasetError(
                    f"{self.where}: {row}: token {position + 1} is {token!r}, expected a level-{position} "
                    f"token like {like!r} (pattern {self.pattern.name!r}); every SID lists one token per "
                    "level, in level order"
                )
            out.append(hit[1])
        return out


def stack_codes(rows: list[list[int]], ids: list, where: str) -> np.ndarray:
    """[N, L] codes; every item the same number of levels, ids unique and present."""
    if not rows:
        raise DatasetError(f"{where}: no items; {FORMAT_HINT}")
    levels = len(rows[0])
    for i, r in enumerate(rows):
        if len(r) != levels or not r:
            raise DatasetError(
                f"{where}: item {ids[i]!r} has {len(r)} SID tokens, the first item has {levels}; every item "
                "needs one token per level"
            )
    if any(i is None for i in ids):
        raise DatasetError(f"{where}: an item_id is empty (row {ids.index(None)}); give every item an id")
    if len(set(ids)) != len(ids):
        seen: set = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise DatasetError(f"{where}: item_id {dup!r} appears twice; one row per item")
    return np.asarray(rows, dtype=np.int64)


def read_json_index(path: Path, pattern: SIDPattern) -> ItemSIDs:
    if pattern.templates == sid_pattern("lcrec").templates:
        codes = parse_index(path)  # the importer's reader, with its messages
        return ItemSIDs(tuple(range(len(codes))), codes, str(path))
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: not a UTF-8 JSON object ({e}); {FORMAT_HINT}") from None
    if not isinstance(raw, dict) or not all(k.isdigit() for k in raw):
        raise DatasetError(f'{path}: the index must be a JSON object {{"0": [tokens], ...}} keyed by item id')
    order = sorted(raw, key=int)
    if [int(k) for k in order] != list(range(len(order))):
        raise DatasetError(f"{path}: keys must be the item ids 0..{len(order) - 1}")
    parser = TokenParser(pattern, str(path))
    rows = [parser.codes(_token_list(raw[k], parser, f"key {k!r}"), f"key {k!r}") for k in order]
    return ItemSIDs(
        tuple(range(len(order))), stack_codes(rows, list(range(len(order))), str(path)), str(path)
    )


def _token_list(value: object, parser: TokenParser, row: str) -> list:
    if isinstance(value, str):
        return parser.split(value, row)
    if isinstance(value, list) and value:
        return value
    raise DatasetError(f"{parser.where}: {row}: the SID must be a list of tokens or a string of tokens")


def read_table_file(path: Path, pattern: SIDPattern) -> ItemSIDs:
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path)
        else:  # item ids come back as integers or strings as the file has them; SIDs as strings
            table = pacsv.read_csv(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{path}: cannot be read ({e}); {FORMAT_HINT}") from None
    missing = [c for c in ("item_id", "sid") if c not in table.column_names]
    if missing:
        raise DatasetError(
            f"{path}: no column {' or '.join(missing)} (has {table.column_names}); {FORMAT_HINT}"
        )
    ids = table.column("item_id").to_pylist()
    sids = table.column("sid").to_pylist()
    parser = TokenParser(pattern, str(path))
    rows = []
    for n, (item, sid) in enumerate(zip(ids, sids)):
        row = f"row {n + 1} (item {item!r})"
        if isinstance(sid, list) and sid and all(isinstance(c, int) for c in sid):
            rows.append(sid)  # integer codes, as our own items.parquet stores them
            continue
        rows.append(parser.codes(_token_list(sid, parser, row), row))
    codes = stack_codes(rows, ids, str(path))
    if (codes < 0).any():
        raise DatasetError(f"{path}: a SID code is negative; codes are 0..T-1")
    return ItemSIDs(tuple(ids), codes, str(path))


def read_item_sids(
    path: str | os.PathLike, pattern: str | SIDPattern = "lcrec", table: SIDTokenTable | None = None
) -> ItemSIDs:
    """Items' SIDs from a JSON index, Parquet or CSV file; checked against `table` when given."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{p}: no such file; {FORMAT_HINT}")
    pat = sid_pattern(pattern)
    if p.suffix == ".json":
        items = read_json_index(p, pat)
    elif p.suffix in (".parquet", ".csv"):
        items = read_table_file(p, pat)
    else:
        raise DatasetError(f"{p}: unknown suffix {p.suffix!r}; {FORMAT_HINT}")
    if table is not None:
        items.check(table)
    return items
