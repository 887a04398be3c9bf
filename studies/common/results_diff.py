"""Do two result folders hold the same configurations with the same quality? (a refactor's check)

    python -m genrec.studies.common.results_diff BEFORE/runs/results AFTER/runs/results --experiment demo

A configuration is (decoder, its parameters, model, draft, dataset, split, seed), the folders' own paths
reduced to their last part so two clones compare. Quality is every quality column (hr@K, ndcg@K,
recall@K, invalid_rate) and the decoders' counters, which a behaviour-preserving change leaves
identical; latency is left out (machines drift). Prints one line per difference and exits 1 when there
is any, 0 when the configurations and their quality columns agree exactly.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.results_store import read_results

QUALITY_PREFIXES = ("hr@", "ndcg@", "recall@", "invalid_rate", "count_")
CONFIG = ("decoder", "decoder_params", "model", "draft", "dataset", "split", "seed")


def short(value: object) -> object:
    """A folder path reduced to its last part, so two clones compare."""
    return Path(value).name if isinstance(value, str) and "/" in value else value


def row_params(row: pd.Series) -> dict:
    return {k: short(v) for k, v in json.loads(row["decoder_params"]).items()}


def config_key(row: pd.Series, shared: set[str] | None = None) -> tuple:
    """The configuration of a row; with `shared`, only those parameter names count (a parameter one
    version added, or removed, is not a difference of configuration: it is named once instead)."""
    params = {k: v for k, v in row_params(row).items() if shared is None or k in shared}
    return tuple(
        json.dumps(params, sort_keys=True) if c == "decoder_params" else short(row.get(c)) for c in CONFIG
    )


def shared_params(before: pd.DataFrame, after: pd.DataFrame) -> tuple[set[str], list[str]]:
    """Parameter names both sides record, and one line per name only one side has (with its values)."""
    names = [{k for _, r in df.iterrows() for k in row_params(r)} for df in (before, after)]
    lines = []
    for side, own, other, df in (("before", *names, before), ("after", names[1], names[0], after)):
        for name in sorted(own - other):
            values = sorted(
                {repr(row_params(r).get(name)) for _, r in df.iterrows() if name in row_params(r)}
            )
            lines.append(f"parameter {name} only {side} (values {', '.join(values)}): not compared")
    return names[0] & names[1], lines


def quality_columns(df: pd.DataFrame) -> list[str]:
    return sorted(c for c in df.columns if c.startswith(QUALITY_PREFIXES))


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def differences(before: pd.DataFrame, after: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(differences, notes): one line per configuration only one side has and per quality value that
    differs; notes name the parameters only one side records."""
    shared, notes = shared_params(before, after)
    b = {config_key(r, shared): r for _, r in before.iterrows()}
    a = {config_key(r, shared): r for _, r in after.iterrows()}
    out = [f"only before: {k}" for k in sorted(set(b) - set(a), key=str)]
    out += [f"only after: {k}" for k in sorted(set(a) - set(b), key=str)]
    columns = sorted(set(quality_columns(before)) | set(quality_columns(after)))
    for key in sorted(set(a) & set(b), key=str):
        for c in columns:
            x, y = b[key].get(c), a[key].get(c)
            if not same(x, y):
                out.append(f"{key[0]} {key[1]}: {c} {x!r} -> {y!r}")
    return out, notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="results folder (runs/results) of the first run")
    p.add_argument("after", help="results folder of the second run")
    p.add_argument("--experiment", default=None, help="compare only this experiment's rows")
    a = p.parse_args(argv)
    before, after = read_results(a.before, a.experiment), read_results(a.after, a.experiment)
    if before.empty or after.empty:
        raise UserInputError(f"no result rows in {a.before if before.empty else a.after}: check the folder")
    lines, notes = differences(before, after)
    print("\n".join(notes + lines))
    print(
        f"{len(before)} / {len(after)} rows; {len(quality_columns(after))} quality columns; "
        f"{'identical' if not lines else f'{len(lines)} differences'}"
    )
    return 1 if lines else 0


if __name__ == "__main__":
    run_main(main)
