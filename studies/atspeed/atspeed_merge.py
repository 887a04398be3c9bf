"""Merge AtSpeed objectives runs into one comparison, with the driver's own tests.

    python -m genrec.studies.atspeed.atspeed_merge /tmp/as19/part1.json /tmp/as19/part2.json \\
        paper:/tmp/as20/paper_s42.json paper:/tmp/as20/paper_s43.json paper:/tmp/as20/paper_s44.json \\
        --pair 'paper:seqkd@0.7>paper:atspeed_s@0.7' --pair 'atspeed_s@0.7>paper:atspeed_s@0.7' \\
        --out merged.json

Long training runs are split over processes (one per seed, one per objective) and re-measured later
from their cached drafts; each writes an `atspeed_objectives --out` file. Strict rows are deterministic
and relaxed rows seeded, so rows from different files for the same users, K, N and gamma are the same
measurement and can be compared as if one run had made them. This module checks that they were (the
same data, target, users, gamma and teacher K), refuses a (label, K, N, verification, seed) that two
files both hold, and runs `atspeed_objectives.compare` over the union: per setting and label the AS@K
per seed and median, AtSpeed-S (strict) or AtSpeed-R (relaxed) against every other label, and relaxed
Recall@K against sampling. `PREFIX:FILE` prefixes that file's labels, so two recipes of one objective
can sit side by side; each `--pair 'A>B'` adds the one-sided tests of "A accepts more than B" in every
setting (over seeds, paired t; over (seed, user) pairs, sign flip).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from genrec.studies.atspeed.atspeed_objectives import (
    compare,
    index_rows,
    more_accepted,
    print_summary,
    row_key,
    setting_name,
)
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.io import atomic_write_text

# a run's options that must agree for its rows to be comparable with another run's
SAME_SETUP = ("data", "target", "users", "gamma", "teacher_k")


def parse_part(spec: str) -> tuple[str, Path]:
    """`FILE` or `PREFIX:FILE` -> (label prefix `PREFIX:`, path); the file must exist."""
    name, sep, path = spec.partition(":")
    if not sep or not name or "/" in name:  # a plain path (a path with a colon has a slash first)
        prefix, path = "", spec
    else:
        prefix = f"{name}:"
    if not Path(path).is_file():
        raise UserInputError(f"{path}: no such file; give an `atspeed_objectives --out` file, or PREFIX:FILE")
    return prefix, Path(path)


def load_part(prefix: str, path: Path) -> tuple[dict, list[dict]]:
    """One run's options and its rows, each row's label prefixed."""
    try:
        run = json.loads(path.read_text())
        args = run["args"]
        rows = [r | {"objective": prefix + r["objective"]} for r in run["rows"]]
        for r in rows:
            row_key(r)  # every row has the fields it is looked up by
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserInputError(f"{path}: not an `atspeed_objectives --out` file ({e!r})") from None
    return args, rows


def check_same_setup(parts: list[tuple[Path, dict]]) -> None:
    """Every part was measured on the same data, target, users, gamma and teacher K."""
    first_path, first = parts[0]
    for path, args in parts[1:]:
        for key in SAME_SETUP:
            if args.get(key) != first.get(key):
                raise UserInputError(
                    f"{path} has --{key.replace('_', '-')} {args.get(key)!r} but {first_path} has "
                    f"{first.get(key)!r}: its rows are a different measurement; merge runs of one setup only"
                )


def merge_rows(specs: list[str]) -> list[dict]:
    """The union of the parts' rows; a (label, K, N, verification, seed) held by two parts is refused."""
    loaded = [(path, *load_part(prefix, path)) for prefix, path in map(parse_part, specs)]
    check_same_setup([(path, args) for path, args, _ in loaded])
    seen: dict[tuple, Path] = {}
    rows = []
    for path, _, part_rows in loaded:
        for r in part_rows:
            key = row_key(r)
            if key in seen:
                raise UserInputError(
                    f"{key} is in both {seen[key]} and {path}; give one of them a prefix (PREFIX:FILE)"
                )
            seen[key] = path
            rows.append(r)
    return rows


def complete_settings(rows: list[dict]) -> tuple[list[str], list[tuple[int, int, str]], list[int]]:
    """The labels (in file order), the (K, N, verification) settings every label has for every seed,
    and the seeds; a label measured on other seeds than the rest is refused."""
    labels = list(dict.fromkeys(r["objective"] for r in rows))
    seeds_of = {o: sorted({r["seed"] for r in rows if r["objective"] == o}) for o in labels}
    seeds = seeds_of[labels[0]]
    for o in labels:
        if seeds_of[o] != seeds:
            raise UserInputError(
                f"{o} has seeds {seeds_of[o]} but {labels[0]} has {seeds}; merge whole seed sets"
            )
    have = index_rows(rows)
    every = sorted({setting for _, setting, _ in have}, reverse=True)
    settings = [s for s in every if all((o, s, seed) in have for o in labels for seed in seeds)]
    if not settings:
        raise UserInputError("no (K, N, verification) setting is measured for every label and seed")
    return labels, settings, seeds


def parse_pair(spec: str, labels: list[str]) -> tuple[str, str]:
    a, sep, b = spec.partition(">")
    if not sep or a not in labels or b not in labels or a == b:
        raise UserInputError(f"--pair {spec!r}: want 'A>B' with two different labels among {labels}")
    return a, b


def pair_tests(rows: list[dict], pairs: list[tuple[str, str]], settings: list, seeds: list[int]) -> dict:
    """Per setting, each pair's one-sided tests of "A accepts more steps than B"."""
    by = index_rows(rows)
    tests = {key: {f"{a}>{b}": more_accepted(by, a, b, key, seeds) for a, b in pairs} for key in settings}
    return {setting_name(key): per_pair for key, per_pair in tests.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m genrec.studies.atspeed.atspeed_merge", description=__doc__.split("\n")[0]
    )
    p.add_argument("parts", nargs="+", help="atspeed_objectives --out files, each FILE or PREFIX:FILE")
    p.add_argument("--pair", action="append", default=[], help="'A>B': test that label A accepts more")
    p.add_argument("--out", default=None, help="JSON file: the merged rows (no per-user vectors), the tests")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rows = merge_rows(args.parts)
    labels, settings, seeds = complete_settings(rows)
    pairs = [parse_pair(spec, labels) for spec in args.pair]
    result = {
        "parts": args.parts,
        "seeds": seeds,
        "summary": compare(rows, labels, settings),
        "pairs": pair_tests(rows, pairs, settings, seeds),
        "rows": [{k: v for k, v in r.items() if not k.startswith("per_user")} for r in rows],
    }
    print_summary(result["summary"])
    for setting, tests in result["pairs"].items():
        for pair, t in tests.items():
            print(f"{setting}  {pair}: " + "  ".join(f"{n} p {v['p_value']:.4f}" for n, v in t.items()))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1, default=str) + "\n")
    return result


if __name__ == "__main__":
    run_main(main)
