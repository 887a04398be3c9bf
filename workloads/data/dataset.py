"""The dataset directory: the one on-disk format every workload reads.

    DIR/interactions.parquet   user_id, item_id, position, split ("train" | "valid" | "test")
    DIR/items.parquet          item_id, sid (list<int64>, one code per level), source_id,
                               optional features (list<float32>)
    DIR/manifest.json          levels, codebook sizes, counts, provenance, split rule, SID stats

User and item ids are dense 0-based integers; importers remap the source's ids and keep the
original in `source_id`. `position` orders a user's interactions in time (0-based, across
splits). Evaluation follows the AtSpeed/LC-Rec convention: for split s the history is every
interaction of the user in the earlier splits, the targets are the user's items in s.

Writes are atomic: everything goes to a temporary sibling folder that is renamed into place,
so a failed import never leaves a half-written dataset.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from genrec.workloads.errors import UserInputError
from genrec.workloads.io import temp_sibling_dir
from genrec.workloads.sid_codec import SIDCodec

SCHEMA_VERSION = 1
SPLITS = ("train", "valid", "test")


class DatasetError(UserInputError):
    """Malformed input or dataset folder; the message names the file, line and the fix."""


@dataclass
class Manifest:
    name: str
    codebook_sizes: list[int]
    num_users: int
    num_items: int
    counts: dict[str, int]
    split_rule: str
    provenance: dict = field(default_factory=dict)
    sid_stats: dict = field(default_factory=dict)
    feature_dim: int = 0
    schema_version: int = SCHEMA_VERSION

    @property
    def levels(self) -> int:
        return len(self.codebook_sizes)

    def to_json(self) -> str:
        d = asdict(self)
        d["levels"] = self.levels
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, path: str = "manifest.json") -> Manifest:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON ({e}); rebuild the dataset folder") from e
        if not isinstance(d, dict):
            raise DatasetError(
                f"{path}: expected a JSON object, got {type(d).__name__}; rebuild the dataset folder"
            )
        check_manifest_types(d, path)
        d.pop("levels", None)
        if d.get("schema_version") != SCHEMA_VERSION:
            raise DatasetError(
                f"{path}: schema_version {d.get('schema_version')!r}, this genrec reads {SCHEMA_VERSION}; "
                "re-run `genrec data synth` or `genrec data import` to rebuild it"
            )
        try:
            return cls(**d)
        except TypeError as e:
            raise DatasetError(f"{path}: unexpected fields ({e}); rebuild the dataset folder") from e


MAX_CODEBOOK_SIZE = 1 << 20  # codes per level; far above any codebook, far below what exhausts memory


def check_manifest_types(d: dict, path: str) -> None:
    """The manifest's fields have their types (and `levels`, when given, matches the codebooks), so a
    hand-edited manifest fails here naming the field, not later with a traceback."""
    sizes = d.get("codebook_sizes")
    if not (
        isinstance(sizes, list)
        and sizes
        and all(type(c) is int and 1 <= c <= MAX_CODEBOOK_SIZE for c in sizes)
    ):
        raise DatasetError(
            f"{path}: `codebook_sizes` must be a list of integers in 1..{MAX_CODEBOOK_SIZE}, got "
            f"{sizes!r:.80}; rebuild the dataset folder"
        )
    if "levels" in d and (type(d["levels"]) is not int or d["levels"] != len(sizes)):
        raise DatasetError(
            f"{path}: `levels` must be the integer {len(sizes)} (one per codebook), got {d['levels']!r:.40}; "
            "rebuild the dataset folder"
        )
    for name in ("num_users", "num_items", "feature_dim"):
        if name in d and (type(d[name]) is not int or d[name] < 0):
            raise DatasetError(f"{path}: `{name}` must be a non-negative integer, got {d[name]!r:.40}")
    for name, kind in (("name", str), ("split_rule", str), ("counts", dict), ("provenance", dict)):
        if name in d and not isinstance(d[name], kind):
            raise DatasetError(f"{path}: `{name}` must be a {kind.__name__}, got {type(d[name]).__name__}")


@dataclass
class EvalExample:
    user_id: int
    history: list[int]  # item ids, oldest first
    targets: list[int]  # item ids of the evaluated split (one or more)


@dataclass
class Dataset:
    root: Path
    manifest: Manifest
    interactions: pd.DataFrame
    items: pd.DataFrame

    # --- derived views ---------------------------------------------------------------------
    @property
    def codec(self) -> SIDCodec:
        return SIDCodec(tuple(self.manifest.codebook_sizes))

    @property
    def num_items(self) -> int:
        return self.manifest.num_items

    def item_codes(self) -> np.ndarray:
        """[num_items, L] int64 codes, row i is item i."""
        return np.stack(self.items["sid"].to_numpy()).astype(np.int64)

    def item_features(self) -> np.ndarray | None:
        if "features" not in self.items.columns:
            return None
        return np.stack(self.items["features"].to_numpy()).astype(np.float32)

    def user_sequences(self, splits: tuple[str, ...]) -> dict[int, list[int]]:
        """user_id -> item ids in time order, restricted to `splits`."""
        df = self.interactions[self.interactions["split"].isin(splits)]
        df = df.sort_values(["user_id", "position"], kind="stable")
        return {int(u): g.tolist() for u, g in df.groupby("user_id", sort=True)["item_id"]}

    def eval_examples(self, split: str) -> list[EvalExample]:
        """History = the user's items in earlier splits; targets = the user's items in `split`."""
        if split not in ("valid", "test"):
            raise ValueError(f"evaluation split must be 'valid' or 'test', got {split!r}")
        earlier = ("train",) if split == "valid" else ("train", "valid")
        history = self.user_sequences(earlier)
        targets = self.user_sequences((split,))
        return [
            EvalExample(u, history[u], t)
            for u, t in sorted(targets.items())
            if history.get(u)  # a user with no history has nothing to condition on
        ]

    def item_popularity(self, split: str = "train") -> np.ndarray:
        """Interaction count per item id in `split`."""
        ids = self.interactions.loc[self.interactions["split"] == split, "item_id"].to_numpy()
        return np.bincount(ids, minlength=self.num_items)


# --- reading -------------------------------------------------------------------------------------
def load_dataset(root: str | os.PathLike) -> Dataset:
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(
            f"{root}: no such dataset folder; create one with `genrec data synth --out {root}` "
            "or `genrec data import ...`"
        )
    for name in ("manifest.json", "interactions.parquet", "items.parquet"):
        if not (root / name).is_file():
            raise DatasetError(f"{root / name}: missing; the folder is not a genrec dataset (rebuild it)")
    manifest = Manifest.from_json(read_utf8(root / "manifest.json"), str(root / "manifest.json"))
    interactions = read_parquet_file(root / "interactions.parquet")
    items = read_parquet_file(root / "items.parquet")
    ds = Dataset(root, manifest, interactions, items)
    validate_dataset(ds)
    return ds


REBUILD_HINT = "rebuild the folder with `genrec data synth` or `genrec data import` (or restore it)"


def read_utf8(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); {REBUILD_HINT}") from None


def read_parquet_file(path: Path) -> pd.DataFrame:
    """One Parquet file as a DataFrame; a truncated, empty or foreign file is a DatasetError naming it."""
    try:
        return pq.read_table(path).to_pandas()
    except (pa.ArrowException, OSError, ValueError) as e:
        size = path.stat().st_size
        raise DatasetError(
            f"{path}: not a readable Parquet file ({type(e).__name__}: {e}; {size} bytes); the file is "
            f"truncated or corrupt: {REBUILD_HINT}"
        ) from None


def validate_dataset(ds: Dataset) -> None:
    """Cheap consistency checks so a corrupt folder fails here, not deep inside training."""
    m, where = ds.manifest, ds.root
    need_i = {"user_id", "item_id", "position", "split"}
    if missing := need_i - set(ds.interactions.columns):
        raise DatasetError(f"{where}/interactions.parquet: missing columns {sorted(missing)}")
    if missing := {"item_id", "sid"} - set(ds.items.columns):
        raise DatasetError(f"{where}/items.parquet: missing columns {sorted(missing)}")
    for file, frame, columns in (
        ("interactions.parquet", ds.interactions, ("user_id", "item_id", "position")),
        ("items.parquet", ds.items, ("item_id",)),
    ):
        for col in columns:
            if not pd.api.types.is_integer_dtype(frame[col].dtype):
                raise DatasetError(
                    f"{where}/{file}: column `{col}` holds {frame[col].dtype} values, not integers; "
                    + REBUILD_HINT
                )
    if len(ds.items) != m.num_items or not np.array_equal(
        ds.items["item_id"].to_numpy(), np.arange(m.num_items)
    ):
        raise DatasetError(f"{where}/items.parquet: item ids must be exactly 0..{m.num_items - 1} in order")
    bad_split = set(ds.interactions["split"].unique()) - set(SPLITS)
    if bad_split:
        raise DatasetError(f"{where}/interactions.parquet: unknown split values {sorted(bad_split)}")
    ids = ds.interactions["item_id"].to_numpy()
    if len(ids) and (ids.min() < 0 or ids.max() >= m.num_items):
        raise DatasetError(f"{where}/interactions.parquet: item ids outside 0..{m.num_items - 1}")
    codes = ds.item_codes() if len(ds.items) else np.zeros((0, m.levels), np.int64)
    try:
        ds.codec.validate_codes(codes, f"{where}/items.parquet sid")
    except ValueError as e:
        raise DatasetError(str(e)) from e
    if len(np.unique(ds.codec.codes_to_keys(codes))) != len(codes):
        raise DatasetError(f"{where}/items.parquet: two items share a semantic ID; resolve collisions first")


# --- writing -------------------------------------------------------------------------------------
def interactions_table(
    users: np.ndarray, items: np.ndarray, positions: np.ndarray, splits: np.ndarray
) -> pa.Table:
    return pa.table(
        {
            "user_id": pa.array(np.asarray(users, dtype=np.int64)),
            "item_id": pa.array(np.asarray(items, dtype=np.int64)),
            "position": pa.array(np.asarray(positions, dtype=np.int32)),
            "split": pa.array(np.asarray(splits, dtype=object), type=pa.string()),
        }
    )


def items_table(
    codes: np.ndarray, source_ids: list[str] | None = None, features: np.ndarray | None = None
) -> pa.Table:
    codes = np.asarray(codes, dtype=np.int64)
    n, levels = codes.shape
    cols: dict[str, pa.Array] = {
        "item_id": pa.array(np.arange(n, dtype=np.int64)),
        "sid": pa.FixedSizeListArray.from_arrays(pa.array(codes.reshape(-1)), levels),
        "source_id": pa.array(
            source_ids if source_ids is not None else [str(i) for i in range(n)], type=pa.string()
        ),
    }
    if features is not None:
        features = np.asarray(features, dtype=np.float32)
        cols["features"] = pa.FixedSizeListArray.from_arrays(
            pa.array(features.reshape(-1)), features.shape[1]
        )
    return pa.table(cols)


def write_dataset(
    out: str | os.PathLike,
    manifest: Manifest,
    interactions: pa.Table,
    items: pa.Table,
    overwrite: bool = False,
) -> Path:
    """Write the three files atomically: build in a temp sibling folder, then rename into place."""
    out = Path(out).resolve()
    if out.exists() and not overwrite:
        raise DatasetError(f"{out}: already exists; pass --overwrite to replace it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling_dir(out)  # removes what a killed earlier writer of `out` left behind
    try:
        pq.write_table(interactions, tmp / "interactions.parquet")
        pq.write_table(items, tmp / "items.parquet")
        (tmp / "manifest.json").write_text(manifest.to_json() + "\n")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def replace_dir(src: Path, dst: Path) -> None:
    """Move folder `src` to `dst`, replacing an existing `dst` with as small a window as possible."""
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def split_counts(splits: np.ndarray) -> dict[str, int]:
    splits = np.asarray(splits, dtype=object)
    return {s: int((splits == s).sum()) for s in SPLITS}
