"""`hf:DIR` wherever a model is named: the HF folder imported once into a cache, keyed by its content.

`resolve_model(spec, data)` is the one place a model argument is read: a plain path comes back as it
is; `hf:DIR` comes back as the folder `genrec model import hf` would write for DIR, built on first use
under the cache root (`$GENREC_HF_CACHE`, default `runs/cache/hf`) and reused while nothing it was built
from changes. The import takes:

- the items' SIDs from the data set the command runs on (`--data`, the serve config's `data`, the
  experiment's `dataset`): its items.parquet, the same catalogue the evaluation decodes (the rule of
  `genrec train --init hf:DIR --data D`); a command without one is refused in one line;
- the SID pattern the tokenizer holds: the first preset (lcrec `<a_N>`, then openonerec `<s_a_N>`) with
  tokens in tokenizer.json; a custom pattern needs an explicit `genrec model import hf`;
- the prompt template DIR/prompt_template.json if present, else the import's default; the stored dtype.

The cache key hashes what decides the import's result: config.json, tokenizer.json,
generation_config.json, prompt_template.json and model.safetensors.index.json by content; each
*.safetensors file by its header (names, shapes, dtypes, offsets), size and mtime (a rewritten weight file
gets a new mtime; hashing gigabytes on every call would cost more than the import); the items' ids and
SIDs by content (as flat arrays); and the options above. The import itself writes a temporary
sibling renamed into place, so a failed or interrupted import leaves no cache entry; two processes that
need the same entry at once import it once (a lock on the cache folder), the second then reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from genrec.workloads.errors import UserInputError

HF_PREFIX = "hf:"
CACHE_ENV, DEFAULT_CACHE = "GENREC_HF_CACHE", Path("runs/cache/hf")
CACHE_FORMAT = 2  # bump when the import's output changes for the same inputs
PRESET_ORDER = ("lcrec", "openonerec")
HASHED_FILES = (
    "config.json",
    "tokenizer.json",
    "generation_config.json",
    "prompt_template.json",
    "model.safetensors.index.json",
)


@dataclass(frozen=True)
class CachedImport:
    """Where `hf:DIR` resolved to, and whether this call imported it (False: reused)."""

    folder: Path
    imported: bool


def is_hf_spec(spec: object) -> bool:
    return isinstance(spec, str | os.PathLike) and str(spec).startswith(HF_PREFIX)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def resolve_model(
    spec: str | os.PathLike,
    data: str | os.PathLike | None,
    role: str = "--model",
    pattern: str | None = None,
) -> Path:
    """`spec` as a checkpoint folder: itself, or for `hf:DIR` its cached import (module doc); `pattern`
    names the SID pattern where the command has a flag for it (else the tokenizer's preset)."""
    if not is_hf_spec(spec):
        return Path(spec)
    return cached_import(str(spec), data, role, pattern).folder


def cached_import(
    spec: str, data: str | os.PathLike | None, role: str = "--model", pattern: str | None = None
) -> CachedImport:
    """Import `hf:DIR` into the cache unless an entry with the same key is there; one progress line
    (stderr) when it imports."""
    from genrec.workloads.models.hf_checkpoint import import_hf_checkpoint

    src = Path(spec[len(HF_PREFIX) :]).expanduser()
    where = f"{role} {spec}"
    if not (src / "config.json").is_file():
        raise UserInputError(
            f"{where}: no config.json in {src}; name a Hugging Face folder (save_pretrained) after hf:"
        )
    items = items_file(data, where)
    pattern = pattern or detect_pattern(src, where)
    template = src / "prompt_template.json"
    template = template if template.is_file() else None
    key = cache_key(src, items, pattern)
    folder = (cache_root() / f"{src.resolve().name}-{key[:16]}").resolve()
    if (folder / "config.json").is_file():  # renamed into place whole: present means complete
        return CachedImport(folder, False)
    with import_lock(folder):  # another process importing the same entry: wait for it, then reuse
        if (folder / "config.json").is_file():
            return CachedImport(folder, False)
        print(f"importing {spec} -> {folder} (first use)", file=sys.stderr, flush=True)
        try:
            import_hf_checkpoint(src, items, folder, pattern, template)
        except UserInputError as e:  # which argument the refused import came from
            raise UserInputError(f"{where}: {e}") from None
    return CachedImport(folder, True)


@contextmanager
def import_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on imports into `folder`'s cache root (flock on the directory itself: no lock
    file is left behind; imports are rare, so one at a time per cache is no loss)."""
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def items_file(data: str | os.PathLike | None, where: str) -> Path:
    """The data set's items.parquet: the SIDs an hf:DIR import reads (module doc)."""
    if data is None:
        raise UserInputError(
            f"{where}: the import needs the items' SIDs; pass --data D (the data set's items.parquet), "
            "or import it first with `genrec model import hf --items FILE`"
        )
    file = Path(data) / "items.parquet"
    if not file.is_file():
        raise UserInputError(
            f"{where}: {data} has no items.parquet for the items' SIDs; pass a data set folder as --data"
        )
    return file


def detect_pattern(src: Path, where: str) -> str:
    """The first preset SID pattern with tokens in DIR's tokenizer.json."""
    from genrec.workloads.tokenize.sid_tokens import load_tokenizer, match_sid_token, sid_pattern

    vocab = load_tokenizer(src).get_vocab(with_added_tokens=True)
    for name in PRESET_ORDER:
        pat = sid_pattern(name)
        regexes = pat.regexes()
        if any(match_sid_token(pat, regexes, token) for token in vocab):
            return name
    raise UserInputError(
        f"{where}: tokenizer.json holds no SID tokens of a preset (lcrec <a_N>, openonerec <s_a_N>); "
        "import it with `genrec model import hf --sid-pattern ...` and name that folder"
    )


def safetensors_header(file: Path) -> bytes:
    """The header of a safetensors file (8-byte length, then JSON): every tensor's name, dtype, shape and
    offsets; refused in one line when it cannot be read."""
    try:
        with file.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = f.read(n) if 0 < n < 100_000_000 else b""
    except OSError as e:
        raise UserInputError(f"{file}: unreadable ({e}); restore the checkpoint's weights") from None
    if len(header) != n or not header:
        raise UserInputError(f"{file}: not a safetensors file (bad header); restore the checkpoint's weights")
    return header


def sid_arrays(table) -> tuple:
    """(item ids, SID lengths, SID values) of an items table as numpy arrays (its logical content)."""
    import numpy as np
    import pyarrow.compute as pc

    sid = table.column("sid").combine_chunks()
    flat = [table.column("item_id"), pc.list_value_length(sid), pc.list_flatten(sid)]
    return tuple(np.ascontiguousarray(x.to_numpy(zero_copy_only=False)) for x in flat)


def cache_key(src: Path, items: Path, pattern: str) -> str:
    """sha256 over the import's inputs (module doc)."""
    import pyarrow.parquet as pq

    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "pattern": pattern}).encode())
    for name in HASHED_FILES:
        file = src / name
        h.update(f"\0{name}\0".encode())
        h.update(file.read_bytes() if file.is_file() else b"<absent>")
    for file in sorted(src.glob("*.safetensors")):
        st = file.stat()
        h.update(f"\0{file.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        h.update(hashlib.sha256(safetensors_header(file)).digest())
    # the SIDs by content (not the file's mtime), as flat arrays: one pass over the bytes, the same for any
    # row-group layout (Python objects per item cost seconds on a million-item catalogue)
    for part in sid_arrays(pq.read_table(items, columns=["item_id", "sid"])):
        h.update(f"\0{part.dtype}\0{part.size}\0".encode())
        h.update(part.tobytes() if part.dtype != object else "\0".join(map(str, part)).encode())
    return h.hexdigest()
