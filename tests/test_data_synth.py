"""Synthetic generator: determinism, every knob, distinct SIDs and learnable sequential structure."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from genrec.workloads.data.dataset import DatasetError, load_dataset
from genrec.workloads.data.synth import SynthConfig, generate_synthetic, synth_dataset


def frames(cfg: SynthConfig) -> tuple:
    manifest, inter, items = generate_synthetic(cfg)
    return manifest, inter.to_pandas(), items.to_pandas()


def codes_of(items: pd.DataFrame) -> np.ndarray:
    return np.stack(items["sid"].to_numpy()).astype(np.int64)


def hit_rates(inter: pd.DataFrame, num_items: int, k: int = 10) -> tuple[float, float]:
    """HR@k on test of most-popular vs a first-order Markov predictor, both fitted on train + valid."""
    hist = inter[inter["split"] != "test"].sort_values(["user_id", "position"])
    test = inter[inter["split"] == "test"].set_index("user_id")["item_id"]
    pop = np.bincount(hist["item_id"], minlength=num_items).astype(float)
    u, it = hist["user_id"].to_numpy(), hist["item_id"].to_numpy()
    same_user = u[1:] == u[:-1]
    trans = np.zeros((num_items, num_items))
    np.add.at(trans, (it[:-1][same_user], it[1:][same_user]), 1.0)
    last = hist.groupby("user_id")["item_id"].last().loc[test.index].to_numpy()
    targets = test.to_numpy()
    hr_pop = float(np.isin(targets, np.argsort(-pop)[:k]).mean())
    scores = trans[last] + 1e-6 * pop  # popularity breaks ties / fills unseen rows
    top = np.argsort(-scores, axis=1)[:, :k]
    hr_markov = float((top == targets[:, None]).any(axis=1).mean())
    return hr_pop, hr_markov


@pytest.fixture(scope="module")
def default_data():
    return frames(SynthConfig())


def test_defaults_manifest_and_tables(default_data):
    manifest, inter, items = default_data
    cfg = SynthConfig()
    assert manifest.levels == 3 and manifest.codebook_sizes == [32, 32, 32]
    assert manifest.num_users == 2000 and manifest.num_items == 1000
    assert manifest.split_rule == "leave-one-out"
    assert sum(manifest.counts.values()) == len(inter)
    assert manifest.counts == {s: int((inter["split"] == s).sum()) for s in ("train", "valid", "test")}
    prov = manifest.provenance
    assert prov["generator"] == "genrec.synth" and prov["version"]
    assert prov["config"]["seed"] == cfg.seed and prov["config"]["popularity_skew"] == cfg.popularity_skew
    assert prov["config"]["codebook_size"] == [32, 32, 32]
    assert set(inter["user_id"]) == set(range(2000))
    assert inter["item_id"].between(0, 999).all()
    assert list(items["item_id"]) == list(range(1000))
    feats = np.stack(items["features"].to_numpy())
    assert feats.shape == (1000, 32) and feats.dtype == np.float32 and manifest.feature_dim == 32


def test_sids_unique_in_range_and_recorded(default_data):
    manifest, _, items = default_data
    codes = codes_of(items)
    assert codes.shape == (1000, 3)
    assert (codes >= 0).all() and (codes < 32).all()
    assert len(np.unique(codes, axis=0)) == 1000
    stats = manifest.sid_stats
    assert stats["distinct_before"] == 1000 and stats["colliding_items"] == 0
    assert stats["disambiguation_level"] is False
    assert len(stats["utilisation"]) == 3
    assert stats["utilisation"][0] == pytest.approx(len(np.unique(codes[:, 0])) / 32)


def test_sid_prefix_follows_latent_clusters(default_data):
    _, _, items = default_data
    codes = codes_of(items)
    # 20 clusters <= 32 codes: level 1 is exactly a function of the cluster, and one-to-one
    per_cluster = items.assign(c0=codes[:, 0]).groupby("cluster")["c0"].nunique()
    assert (per_cluster == 1).all()
    assert items.assign(c0=codes[:, 0]).groupby("c0")["cluster"].nunique().max() == 1
    # level 2 separates sub-clusters inside a cluster
    key = items.assign(c1=codes[:, 1] // 8)
    assert (key.groupby(["cluster", "subcluster"])["c1"].nunique() == 1).all()


def test_features_recover_clusters(default_data):
    _, _, items = default_data
    feats = np.stack(items["features"].to_numpy()).astype(np.float64)
    cluster = items["cluster"].to_numpy()
    centres = np.stack([feats[cluster == c].mean(axis=0) for c in range(cluster.max() + 1)])
    nearest = ((feats[:, None, :] - centres[None]) ** 2).sum(-1).argmin(axis=1)
    assert (nearest == cluster).mean() > 0.95


def test_same_seed_same_data_different_seed_differs():
    a = generate_synthetic(SynthConfig(seed=7, num_users=300))
    b = generate_synthetic(SynthConfig(seed=7, num_users=300))
    c = generate_synthetic(SynthConfig(seed=8, num_users=300))
    assert a[0].to_json() == b[0].to_json()
    assert a[1].equals(b[1]) and a[2].equals(b[2])
    assert not a[1].equals(c[1])
    assert not a[2].column("sid").equals(c[2].column("sid"))


def test_leave_one_out_one_valid_one_test_at_the_end(default_data):
    _, inter, _ = default_data
    g = inter.groupby("user_id")
    assert (g.size() >= 3).all()
    per_user = inter.pivot_table(index="user_id", columns="split", values="item_id", aggfunc="size")
    assert (per_user["valid"] == 1).all() and (per_user["test"] == 1).all()
    n = g["position"].transform("size")
    assert (inter.loc[inter["split"] == "test", "position"] == n[inter["split"] == "test"] - 1).all()
    assert (inter.loc[inter["split"] == "valid", "position"] == n[inter["split"] == "valid"] - 2).all()
    # positions are 0..n-1 per user
    assert (g["position"].apply(lambda p: sorted(p) == list(range(len(p))))).all()


def test_temporal_split_is_global_8_1_1_and_time_ordered_per_user():
    manifest, inter, _ = frames(SynthConfig(split="temporal", num_users=500))
    n = len(inter)
    assert manifest.split_rule == "temporal"
    assert abs(manifest.counts["train"] - 0.8 * n) <= 1 and abs(manifest.counts["valid"] - 0.1 * n) <= 1
    rank = inter["split"].map({"train": 0, "valid": 1, "test": 2})
    ordered = inter.assign(r=rank).sort_values(["user_id", "position"])
    assert (ordered.groupby("user_id")["r"].apply(lambda r: r.is_monotonic_increasing)).all()
    # unlike leave-one-out, some users have no test item at all
    assert inter.loc[inter["split"] == "test", "user_id"].nunique() < 500


@pytest.mark.parametrize(("levels", "size"), [(2, 32), (4, (8, 16, 16, 8)), (1, 1000)])
def test_levels_and_codebook_sizes(levels, size):
    manifest, _, items = frames(SynthConfig(num_users=200, levels=levels, codebook_size=size))
    sizes = [size] * levels if isinstance(size, int) else list(size)
    assert manifest.codebook_sizes == sizes and manifest.levels == levels
    codes = codes_of(items)
    assert codes.shape == (1000, levels)
    assert (codes >= 0).all() and (codes < np.array(sizes)).all()
    assert len(np.unique(codes, axis=0)) == 1000


def test_full_codebook_forces_probing_but_keeps_levels():
    cfg = SynthConfig(
        num_users=100, num_items=64, levels=2, codebook_size=8, num_clusters=3, num_subclusters=2
    )
    manifest, _, items = frames(cfg)
    codes = codes_of(items)
    assert manifest.codebook_sizes == [8, 8]
    assert len(np.unique(codes, axis=0)) == 64  # every one of the 64 SIDs used once
    assert manifest.sid_stats["relocated_items"] > 0


def test_popularity_skew_changes_the_popularity_distribution():
    def top_share(skew: float) -> float:
        _, inter, _ = frames(SynthConfig(num_users=1000, popularity_skew=skew, follow_prob=0.0))
        counts = np.sort(np.bincount(inter["item_id"], minlength=1000))[::-1]
        return counts[:50].sum() / counts.sum()

    flat, default, steep = top_share(0.0), top_share(1.0), top_share(1.5)
    assert flat < 0.12  # uniform popularity: top 5% of items get little more than 5%
    assert flat < default < steep
    assert steep > 0.5


def test_history_length_knobs():
    _, inter, _ = frames(SynthConfig(num_users=500, min_history=4, mean_history=5, max_history=7))
    lengths = inter.groupby("user_id").size()
    assert lengths.min() >= 4 and lengths.max() <= 7
    _, inter, _ = frames(SynthConfig(num_users=2000, min_history=5, mean_history=20, max_history=200))
    assert 17 < inter.groupby("user_id").size().mean() < 23


def test_drift_and_follow_knobs_shape_the_sequences():
    base = SynthConfig(num_users=300, follow_prob=0.0, sub_stickiness=0.0)
    # no drift: a user never leaves their first cluster
    _, inter, items = frames(replace(base, drift_prob=0.0))
    clusters = items["cluster"].to_numpy()[inter["item_id"]]
    assert (inter.assign(c=clusters).groupby("user_id")["c"].nunique() == 1).all()
    # always drift: consecutive items are always in different clusters (successors exclude self)
    _, inter, items = frames(replace(base, drift_prob=1.0))
    inter = inter.sort_values(["user_id", "position"])
    c = items["cluster"].to_numpy()[inter["item_id"]]
    same_user = inter["user_id"].to_numpy()[1:] == inter["user_id"].to_numpy()[:-1]
    assert (c[1:][same_user] != c[:-1][same_user]).all()
    # always follow: each item has exactly one next item
    _, inter, _ = frames(replace(base, follow_prob=1.0))
    inter = inter.sort_values(["user_id", "position"])
    it = inter["item_id"].to_numpy()
    same_user = inter["user_id"].to_numpy()[1:] == inter["user_id"].to_numpy()[:-1]
    pairs = pd.DataFrame({"a": it[:-1][same_user], "b": it[1:][same_user]})
    assert (pairs.groupby("a")["b"].nunique() == 1).all()


def test_structure_is_learnable_markov_beats_most_popular(default_data):
    manifest, inter, _ = default_data
    hr_pop, hr_markov = hit_rates(inter, manifest.num_items)
    assert hr_markov > 2 * hr_pop and hr_markov - hr_pop > 0.2, (hr_pop, hr_markov)


def test_without_structure_markov_does_not_help():
    # control: the Markov margin above comes from the latent structure, not from the metric
    cfg = SynthConfig(num_clusters=1, num_subclusters=1, follow_prob=0.0, popularity_skew=1.0)
    manifest, inter, _ = frames(cfg)
    hr_pop, hr_markov = hit_rates(inter, manifest.num_items)
    assert hr_markov < hr_pop + 0.05, (hr_pop, hr_markov)


def test_no_features_when_feature_dim_zero():
    manifest, _, items = frames(SynthConfig(num_users=50, feature_dim=0))
    assert "features" not in items.columns and manifest.feature_dim == 0


@pytest.mark.parametrize(
    ("knobs", "needle"),
    [
        ({"num_items": 40000}, "do not fit"),
        ({"codebook_size": (32, 32)}, "levels is 3"),
        ({"min_history": 2}, "min_history"),
        ({"min_history": 10, "mean_history": 8}, "mean_history"),
        ({"num_clusters": 2000}, "num_clusters"),
        ({"drift_prob": 1.5}, "drift_prob"),
        ({"split": "random"}, "split"),
        ({"popularity_skew": -1.0}, "popularity_skew"),
    ],
)
def test_impossible_settings_are_user_errors(knobs, needle):
    with pytest.raises(DatasetError, match=needle):
        generate_synthetic(SynthConfig(**knobs))


def test_default_size_is_fast():
    generate_synthetic(SynthConfig(num_users=50))  # warm-up
    t0 = time.perf_counter()
    generate_synthetic(SynthConfig())
    assert time.perf_counter() - t0 < 1.0


def test_write_and_load_round_trip(tmp_path):
    cfg = SynthConfig(num_users=200, seed=3)
    out, manifest = synth_dataset(cfg, tmp_path / "ds")
    ds = load_dataset(out)
    assert ds.manifest == manifest
    assert len(ds.eval_examples("test")) == 200
    assert ds.item_features().shape == (1000, 32)
    with pytest.raises(DatasetError, match="already exists"):
        synth_dataset(cfg, tmp_path / "ds")
    synth_dataset(replace(cfg, seed=4), tmp_path / "ds", overwrite=True)
    assert load_dataset(tmp_path / "ds").manifest.provenance["config"]["seed"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temp folders left behind


def test_cli_synth_and_info(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = [
        "data",
        "synth",
        "--out",
        str(out),
        "--seed",
        "5",
        "--num-users",
        "100",
        "--codebook-size",
        "16,16,8",
    ]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "users        100" in printed and str(out) in printed
    assert load_dataset(out).manifest.codebook_sizes == [16, 16, 8]
    assert run_cli(["data", "info", str(out)]) == 0
    assert "codebook sizes [16, 16, 8]" in capsys.readouterr().out
    assert run_cli(["data", "synth", "--out", str(tmp_path / "bad"), "--num-items", "999999"]) == 2
    assert "do not fit" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert run_cli(["data", "info", str(tmp_path / "missing")]) == 2
