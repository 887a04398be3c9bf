"""Amazon review importer: 2014 (Python literal) and 2018 (JSON) lines, filters, splits, features, errors."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from genrec.workloads.data.amazon import import_amazon
from genrec.workloads.data.amazon_interactions import k_core
from genrec.workloads.data.dataset import DatasetError, load_dataset

CORE_USERS = [f"U{k:02d}" for k in range(10)]
CORE_ITEMS = [f"B{k:03d}" for k in range(8)]


def fixture_reviews() -> list[dict]:
    """10 users x 6 of 8 items (a 5-core), plus a duplicate, a tie, a sparse user and a sparse item."""
    rnd = random.Random(0)
    rows = []
    for u, user in enumerate(CORE_USERS):
        skip = {u % 8, (u + 3) % 8}
        for j, item in enumerate(i for k, i in enumerate(CORE_ITEMS) if k not in skip):
            t = 1_400_000_000 + rnd.randrange(0, 10_000) * 60
            rows.append(
                {"reviewerID": user, "asin": item, "overall": float(1 + (u + j) % 5), "unixReviewTime": t}
            )
    rows[12]["unixReviewTime"] = rows[13]["unixReviewTime"]  # U02: a tie, resolved by file order
    dup = next(r for r in rows if r["reviewerID"] == "U01" and r["asin"] == "B000")
    rows.append(dict(dup, unixReviewTime=dup["unixReviewTime"] + 10**7, overall=1.0))  # later duplicate
    rows.append({"reviewerID": "LONELY", "asin": "B000", "overall": 5.0, "unixReviewTime": 1_300_000_000})
    rows.append({"reviewerID": "LONELY", "asin": "B001", "overall": 5.0, "unixReviewTime": 1_300_000_001})
    rows.append({"reviewerID": "U00", "asin": "RARE", "overall": 5.0, "unixReviewTime": 1_300_000_002})
    return rows


def render(rows: list[dict]) -> str:
    """Alternate 2018 JSON lines and 2014 Python-literal lines (single quotes, extra keys); one blank line."""
    lines = []
    for k, r in enumerate(rows):
        if k % 2:
            lines.append(repr(dict(r, helpful=[0, 0], reviewText="it's fine", summary=None)))
        else:
            lines.append(json.dumps(dict(r, reviewText="ok")))
        if k == 5:
            lines.append("")
    return "\n".join(lines) + "\n"


META = [
    {
        "asin": "B000",
        "title": "Hydrating Face Cream",
        "categories": [["Beauty", "Skin Care", "Face"]],
        "brand": "Acme",
    },
    {"asin": "B001", "title": "Hydrating Face Cream SPF 30", "categories": [["Beauty", "Skin Care", "Face"]]},
    {"asin": "B002", "title": "Argan Oil Shampoo", "category": ["Beauty", "Hair Care"], "brand": "Hairy"},
    {"asin": "B003", "title": "Argan Oil Conditioner", "category": ["Beauty", "Hair Care"], "brand": "Hairy"},
    {"asin": "B004", "title": "Volume Mascara", "categories": [["Beauty", "Makeup", "Eyes"]], "price": 9.5},
    {"asin": "B005", "title": "Red Nail Polish", "categories": [["Beauty", "Makeup", "Nails"]]},
    {"asin": "B006", "title": "Nail Polish Remover", "categories": [["Beauty", "Makeup", "Nails"]]},
    {"asin": "ZZZ", "title": "not reviewed, ignored"},
]  # B007 has no meta line


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


@pytest.fixture
def files(tmp_path):
    reviews = write_gz(tmp_path / "reviews_Toy_5.json.gz", render(fixture_reviews()))
    meta_text = "\n".join(repr(m) if k % 2 else json.dumps(m) for k, m in enumerate(META)) + "\n"
    meta = tmp_path / "meta_Toy.json"
    meta.write_text(meta_text)
    return reviews, meta


def expected_sequences(rows: list[dict], min_rating: float = 0.0) -> dict[str, list[tuple[int, str]]]:
    """Slow reference for the 5-core fixture: earliest duplicate kept, time order, file order on ties."""
    seqs: dict[str, dict[str, tuple[int, int]]] = {}
    for line, r in enumerate(rows):
        if r["overall"] < min_rating or r["reviewerID"] == "LONELY" or r["asin"] == "RARE":
            continue
        prev = seqs.setdefault(r["reviewerID"], {}).get(r["asin"])
        if prev is None or (r["unixReviewTime"], line) < prev:
            seqs[r["reviewerID"]][r["asin"]] = (r["unixReviewTime"], line)
    return {u: [(t, a) for a, (t, _) in sorted(d.items(), key=lambda kv: kv[1])] for u, d in seqs.items()}


def test_import_mixed_lines_k_core_and_leave_one_out(files, tmp_path):
    reviews, _ = files
    out, manifest = import_amazon(reviews, tmp_path / "ds")
    ds = load_dataset(out)
    assert manifest.name == "reviews_Toy_5"
    assert manifest.num_users == 10 and manifest.num_items == 8  # LONELY and RARE fail the 5-core
    assert manifest.counts == {"train": 40, "valid": 10, "test": 10}
    assert manifest.provenance["stages"] == {
        "reviews_read": 64,
        "after_rating_filter": 64,
        "after_dedupe": 63,
        "after_k_core": 60,
    }
    assert ds.items["source_id"].tolist() == CORE_ITEMS  # dense in sorted asin order
    expected = expected_sequences(fixture_reviews())
    got = ds.user_sequences(("train", "valid", "test"))
    for u, user in enumerate(sorted(CORE_USERS)):
        assert [CORE_ITEMS[i] for i in got[u]] == [a for _, a in expected[user]]
    per_user = ds.interactions.groupby("user_id")["split"].value_counts().unstack()
    assert (per_user["valid"] == 1).all() and (per_user["test"] == 1).all()
    last = ds.interactions.sort_values("position").groupby("user_id").tail(1)
    assert (last["split"] == "test").all()


def test_tie_keeps_file_order(files, tmp_path):
    reviews, _ = files
    rows = fixture_reviews()
    out, _ = import_amazon(reviews, tmp_path / "ds", k_core=1)
    user = sorted([*CORE_USERS, "LONELY"]).index("U02")  # k_core=1 keeps LONELY too
    seq = load_dataset(out).user_sequences(("train", "valid", "test"))[user]
    a, b = CORE_ITEMS.index(rows[12]["asin"]), CORE_ITEMS.index(rows[13]["asin"])
    assert seq.index(a) < seq.index(b)


def test_rating_filter(files, tmp_path):
    reviews, _ = files
    rows = fixture_reviews()
    _, manifest = import_amazon(reviews, tmp_path / "ds", min_rating=4, k_core=1)
    assert manifest.provenance["stages"]["after_rating_filter"] == sum(r["overall"] >= 4 for r in rows)
    kept = {(r["reviewerID"], r["asin"]) for r in rows if r["overall"] >= 4}
    assert sum(manifest.counts.values()) == len(kept)
    assert manifest.provenance["config"]["min_rating"] == 4


def reference_k_core(pairs: set[tuple[int, int]], k: int) -> set[tuple[int, int]]:
    while True:
        users: dict[int, int] = {}
        items: dict[int, int] = {}
        for u, i in pairs:
            users[u] = users.get(u, 0) + 1
            items[i] = items.get(i, 0) + 1
        kept = {(u, i) for u, i in pairs if users[u] >= k and items[i] >= k}
        if kept == pairs:
            return kept
        pairs = kept


@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_k_core_matches_a_slow_reference(k):
    rng = np.random.default_rng(k)
    pairs = {(int(rng.integers(60)), int(rng.zipf(1.6) % 40)) for _ in range(400)}
    users = np.array([p[0] for p in pairs])
    items = np.array([p[1] for p in pairs])
    keep = k_core(users, items, k)
    got = {p for p, m in zip(pairs, keep, strict=True) if m}
    assert got == reference_k_core(set(pairs), k)
    if got:  # the k-core property
        assert np.bincount(users[keep]).max() >= k
        assert all(c >= k for c in np.bincount(users[keep]) if c)
        assert all(c >= k for c in np.bincount(items[keep]) if c)


def test_k_core_property_on_import(files, tmp_path):
    reviews, _ = files
    out, _ = import_amazon(reviews, tmp_path / "ds", k_core=6)
    inter = load_dataset(out).interactions
    assert inter.groupby("user_id").size().min() >= 6 and inter.groupby("item_id").size().min() >= 6


def test_temporal_split_is_global_time_order(files, tmp_path):
    reviews, _ = files
    out, manifest = import_amazon(reviews, tmp_path / "ds", split="temporal")
    assert manifest.split_rule == "temporal"
    assert manifest.counts == {"train": 48, "valid": 6, "test": 6}
    ds = load_dataset(out)
    expected = expected_sequences(fixture_reviews())
    time_of = {(u, a): t for u, seq in expected.items() for t, a in seq}
    users = sorted(CORE_USERS)
    inter = ds.interactions
    t = np.array(
        [time_of[(users[u], CORE_ITEMS[i])] for u, i in zip(inter["user_id"], inter["item_id"], strict=True)]
    )
    split = inter["split"].to_numpy()
    assert t[split == "train"].max() <= t[split == "valid"].min()
    assert t[split == "valid"].max() <= t[split == "test"].min()


def test_meta_features(files, tmp_path):
    reviews, meta = files
    out, manifest = import_amazon(reviews, tmp_path / "a", meta=meta, feature_dim=64)
    feats = load_dataset(out).item_features()
    assert feats.shape == (8, 64) and feats.dtype == np.float32
    assert np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    prov = manifest.provenance
    assert prov["feature_method"].startswith("hashed bag of words")
    assert prov["items_from_meta"] == 7 and prov["items_from_cooccurrence"] == 1  # B007 has no meta
    cos = feats @ feats.T
    assert cos[0, 1] > cos[0, 5] + 0.3  # two face creams vs nail polish
    assert cos[5, 6] > cos[5, 2] + 0.2  # two nail products vs shampoo
    out2, _ = import_amazon(reviews, tmp_path / "b", meta=meta, feature_dim=64)
    assert np.array_equal(load_dataset(out2).item_features(), feats)  # deterministic


def test_features_without_meta_use_cooccurrence(files, tmp_path):
    reviews, _ = files
    out, manifest = import_amazon(reviews, tmp_path / "a", feature_dim=16)
    assert manifest.provenance["feature_method"].startswith("co-occurrence")
    assert manifest.provenance["items_from_cooccurrence"] == 8 and manifest.feature_dim == 16
    feats = load_dataset(out).item_features()
    assert feats.shape == (8, 16) and np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    import_amazon(reviews, tmp_path / "b", feature_dim=16, seed=1)
    assert not np.array_equal(load_dataset(tmp_path / "b").item_features(), feats)  # the seed matters


def test_provisional_sids(files, tmp_path):
    reviews, meta = files
    out, manifest = import_amazon(reviews, tmp_path / "a", meta=meta, levels=2, codebook_size=3)
    codes = load_dataset(out).item_codes()
    assert (
        manifest.sid_stats["sid_method"] == "rq-kmeans" and manifest.provenance["sid_method"] == "rq-kmeans"
    )
    assert manifest.codebook_sizes[:2] == [3, 3]
    assert len(np.unique(codes, axis=0)) == 8  # 8 items in 9 SIDs: collisions resolved, never merged
    assert manifest.levels == 2 + int(manifest.sid_stats["disambiguation_level"])
    out, manifest = import_amazon(reviews, tmp_path / "b", sid_method="radix", levels=3, codebook_size=2)
    assert manifest.codebook_sizes == [2, 2, 2] and not manifest.sid_stats["disambiguation_level"]
    codes = load_dataset(out).item_codes()
    assert (codes @ np.array([4, 2, 1])).tolist() == list(range(8))
    with pytest.raises(DatasetError, match="do not fit"):
        import_amazon(reviews, tmp_path / "c", sid_method="radix", levels=2, codebook_size=2)


def test_plain_text_file_gives_the_same_dataset(files, tmp_path):
    reviews, _ = files
    plain = tmp_path / "plain.json"
    plain.write_text(render(fixture_reviews()))
    a, _ = import_amazon(reviews, tmp_path / "a")
    b, _ = import_amazon(plain, tmp_path / "b")
    assert load_dataset(a).interactions.equals(load_dataset(b).interactions)


def bad_reviews(tmp_path: Path, text: str) -> Path:
    return write_gz(tmp_path / "bad.json.gz", text)


GOOD = json.dumps({"reviewerID": "A", "asin": "X", "overall": 5.0, "unixReviewTime": 1})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            f"{GOOD}\n{GOOD}\n{{'reviewerID': 'A', 'asin': \n",
            r"bad\.json\.gz:3: neither JSON nor a Python dict literal",
        ),
        (f"{GOOD}\n__import__('os').system('echo hi')\n", r"bad\.json\.gz:2: neither JSON"),
        (f"{GOOD}\n[1, 2]\n", r"bad\.json\.gz:2: a line must hold one object"),
        (
            '{"reviewerID": "A", "asin": "X", "overall": 5}\n',
            r"bad\.json\.gz:1: missing key\(s\) \['unixReviewTime'\]",
        ),
        (
            '{"reviewerID": "A", "asin": "X", "overall": "great", "unixReviewTime": 1}\n',
            r":1: overall='great'",
        ),
        ("", r"bad\.json\.gz: empty file"),
        ("\n\n", r"bad\.json\.gz: empty file"),
    ],
)
def test_bad_reviews_are_clear_errors_and_write_nothing(tmp_path, text, needle):
    reviews = bad_reviews(tmp_path, text)
    out = tmp_path / "outs" / "ds"
    out.parent.mkdir()
    with pytest.raises(DatasetError, match=needle):
        import_amazon(reviews, out, k_core=1)
    assert list(out.parent.iterdir()) == []


def test_empty_after_filters_says_which_filter(files, tmp_path):
    reviews, _ = files
    with pytest.raises(
        DatasetError, match=r"rating filter \(overall >= 6\) removed all 64 reviews.*--min-rating"
    ):
        import_amazon(reviews, tmp_path / "a", min_rating=6)
    with pytest.raises(DatasetError, match=r"the 7-core is empty.*smaller --k-core.*k=6"):
        import_amazon(reviews, tmp_path / "b", k_core=7)
    assert {p.name for p in tmp_path.iterdir()} == {
        "reviews_Toy_5.json.gz",
        "meta_Toy.json",
    }  # nothing written


def test_other_errors(files, tmp_path):
    reviews, meta = files
    with pytest.raises(DatasetError, match="no such file"):
        import_amazon(tmp_path / "missing.json.gz", tmp_path / "a")
    bad_meta = tmp_path / "bad_meta.json"
    bad_meta.write_text(json.dumps({"title": "no asin"}) + "\n")
    with pytest.raises(DatasetError, match=r"bad_meta\.json:1: missing key 'asin'"):
        import_amazon(reviews, tmp_path / "a", meta=bad_meta)
    bad_meta.write_text(json.dumps({"asin": "B000"}) + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"bad_meta\.json:2: neither JSON"):
        import_amazon(reviews, tmp_path / "a", meta=bad_meta)
    with pytest.raises(DatasetError, match="split must be one of"):
        import_amazon(reviews, tmp_path / "a", split="random")
    with pytest.raises(DatasetError, match="k_core must be >= 1"):
        import_amazon(reviews, tmp_path / "a", k_core=0)
    (tmp_path / "exists").mkdir()
    with pytest.raises(DatasetError, match="already exists"):
        import_amazon(reviews, tmp_path / "exists")
    not_gzip = tmp_path / "trunc.json.gz"
    not_gzip.write_bytes(gzip.compress(render(fixture_reviews()).encode())[:200])
    with pytest.raises(DatasetError, match=r"trunc\.json\.gz: cannot read"):
        import_amazon(not_gzip, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_cli_import_amazon(files, tmp_path, capsys):
    reviews, meta = files
    out = tmp_path / "cli"
    assert (
        run_cli(
            ["data", "import", "amazon", "--reviews", str(reviews), "--meta", str(meta), "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "users        10" in printed and "k core 60" in printed and str(out) in printed
    assert load_dataset(out).manifest.provenance["importer"] == "amazon"
    bad = [
        "data",
        "import",
        "amazon",
        "--reviews",
        str(reviews),
        "--out",
        str(tmp_path / "x"),
        "--k-core",
        "50",
    ]
    assert run_cli(bad) == 2
    assert "k-core" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
