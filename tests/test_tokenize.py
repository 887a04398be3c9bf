"""Semantic IDs: k-means, RQ-KMeans, RQ-VAE, the tokenize pipeline and `genrec tokenize`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from genrec.workloads.data.dataset import (
    DatasetError,
    Manifest,
    interactions_table,
    items_table,
    load_dataset,
    split_counts,
    write_dataset,
)
from genrec.workloads.errors import UserInputError
from genrec.workloads.sid_codec import ensure_unique_sids
from genrec.workloads.tokenize.kmeans import assign, init_kmeans_pp, kmeans
from genrec.workloads.tokenize.pipeline import TokenizeConfig, sid_statistics, tokenize_dataset
from genrec.workloads.tokenize.rqkmeans import RQKMeansConfig, fit_rq_kmeans
from genrec.workloads.tokenize.rqvae import RQVAEConfig, train_rqvae


# --- helpers -------------------------------------------------------------------------------------
def hierarchical_mixture(
    n: int, n_top: int = 4, n_sub: int = 4, dim: int = 8, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian mixture with centres in two tiers: well-separated top clusters, each split in sub-clusters."""
    rng = np.random.default_rng(seed)
    top_centres = rng.normal(size=(n_top, dim)) * 8.0
    sub_centres = top_centres[:, None, :] + rng.normal(size=(n_top, n_sub, dim)) * 2.0
    sub = rng.integers(0, n_top * n_sub, size=n)
    x = sub_centres.reshape(-1, dim)[sub] + rng.normal(size=(n, dim)) * 0.3
    return x.astype(np.float32), sub // n_sub, sub


def nmi(a: np.ndarray, b: np.ndarray) -> float:
    """Normalised mutual information (arithmetic-mean normalisation)."""
    _, a = np.unique(a, return_inverse=True)
    _, b = np.unique(b, return_inverse=True)
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1.0)
    p = joint / joint.sum()
    pa_, pb_ = p.sum(1), p.sum(0)
    nz = p > 0
    mi = float((p[nz] * np.log(p[nz] / np.outer(pa_, pb_)[nz])).sum())
    ha = -float((pa_[pa_ > 0] * np.log(pa_[pa_ > 0])).sum())
    hb = -float((pb_[pb_ > 0] * np.log(pb_[pb_ > 0])).sum())
    return 2 * mi / (ha + hb) if ha + hb > 0 else 1.0


def reference_lloyd(x: np.ndarray, init: np.ndarray, n_iter: int) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's algorithm written plainly, with the documented tie and empty-cluster rules."""

    def nearest(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = np.array([[float(np.sum((p - q) ** 2)) for q in c] for p in x])
        labels = d.argmin(1)  # first minimum on ties
        return labels, d[np.arange(len(x)), labels]

    c = init.copy()
    for _ in range(n_iter):
        labels, dist = nearest(c)
        new = c.copy()
        empty = []
        for j in range(len(c)):
            members = x[labels == j]
            if len(members):
                new[j] = members.mean(0)
            else:
                empty.append(j)
        farthest = np.argsort(-dist, kind="stable")
        for m, j in enumerate(empty):
            new[j] = x[farthest[m]]
        c = new
    return c, nearest(c)[0]


def write_tiny_dataset(root: Path, n_items: int = 240, dim: int = 8, features: bool = True) -> np.ndarray:
    """A small dataset folder with clustered item features; returns the ground-truth top clusters."""
    x, top, _ = hierarchical_mixture(n_items, dim=dim, seed=1)
    rng = np.random.default_rng(2)
    n_users, per_user = 30, 6
    users = np.repeat(np.arange(n_users), per_user)
    items = rng.integers(0, n_items, size=n_users * per_user)
    positions = np.tile(np.arange(per_user), n_users)
    splits = np.where(
        positions == per_user - 1, "test", np.where(positions == per_user - 2, "valid", "train")
    )
    manifest = Manifest(
        name="tiny",
        codebook_sizes=[n_items],
        num_users=n_users,
        num_items=n_items,
        counts=split_counts(splits),
        split_rule="leave-one-out",
        provenance={"generator": "test_tokenize"},
        feature_dim=dim if features else 0,
    )
    table = items_table(np.arange(n_items)[:, None], features=x if features else None)
    table = table.append_column("category", pa.array(top.astype(np.int64)))
    write_dataset(root, manifest, interactions_table(users, items, positions, splits), table)
    return top


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny matmuls gain nothing from threads, and on a shared 2-core box a busy core makes
    # OpenMP's spinning threads many times slower; pin one thread as the design guide asks.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    write_tiny_dataset(tmp_path / "src")
    return tmp_path / "src"


# --- k-means -------------------------------------------------------------------------------------
def test_kmeans_matches_plain_lloyd():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    init = x[[0, 7, 19, 33, 50]].copy()
    ref_c, ref_labels = reference_lloyd(x, init, n_iter=8)
    res = kmeans(torch.from_numpy(x), 5, n_iter=8, init=torch.from_numpy(init))
    np.testing.assert_array_equal(res.labels.numpy(), ref_labels)
    np.testing.assert_allclose(res.centroids.numpy(), ref_c, atol=1e-10)


def test_kmeans_reseeds_empty_clusters_like_reference():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 2))
    # centre 1 is far from every point and centre 3 duplicates centre 2 (ties go to 2): both start empty
    init = np.array([x[0], [100.0, 100.0], x[5], x[5], x[9]])
    ref_c, ref_labels = reference_lloyd(x, init, n_iter=6)
    res = kmeans(torch.from_numpy(x), 5, n_iter=6, init=torch.from_numpy(init))
    np.testing.assert_array_equal(res.labels.numpy(), ref_labels)
    np.testing.assert_allclose(res.centroids.numpy(), ref_c, atol=1e-10)
    assert len(np.unique(res.labels.numpy())) == 5


def test_kmeans_separates_blobs_and_converges():
    x, top, _ = hierarchical_mixture(400, n_top=4, n_sub=1, seed=3)
    res = kmeans(torch.from_numpy(x), 4, n_iter=50, seed=0)
    assert res.converged and res.n_iter < 50
    assert nmi(res.labels.numpy(), top) == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(
    data=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=30),
        elements=st.integers(-20, 20),
    ),
    k_frac=st.floats(0.0, 1.0),
    init=st.sampled_from(["kmeans++", "random"]),
    seed=st.integers(0, 2**16),
)
def test_kmeans_properties(data: np.ndarray, k_frac: float, init: str, seed: int):
    x = torch.from_numpy(data)
    k = max(1, round(k_frac * len(data)))
    res = kmeans(x, k, n_iter=10, init=init, seed=seed)
    labels = res.labels.numpy()
    assert res.centroids.shape == (k, data.shape[1])
    assert labels.min() >= 0 and labels.max() < k
    # every point sits at its nearest centre (brute force)
    brute = ((data[:, None, :] - res.centroids.numpy()[None]) ** 2).sum(-1)
    np.testing.assert_allclose(brute[np.arange(len(data)), labels], brute.min(1), rtol=1e-9, atol=1e-9)
    # Lloyd never increases the objective from the initial assignment
    start = kmeans(x, k, n_iter=0, init=init, seed=seed)
    assert res.inertia <= start.inertia + 1e-6 * (1 + start.inertia)
    # seeded: the same call gives the same answer
    again = kmeans(x, k, n_iter=10, init=init, seed=seed)
    assert torch.equal(again.labels, res.labels) and torch.equal(again.centroids, res.centroids)


def test_kmeans_pp_on_duplicate_points_picks_distinct_rows():
    x = torch.ones(5, 2, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    assert init_kmeans_pp(x, 5, g).shape == (5, 2)
    res = kmeans(x, 3, n_iter=5)
    assert torch.all(res.distances == 0)


def test_kmeans_assign_chunks_agree(monkeypatch):
    import genrec.workloads.tokenize.kmeans as km

    x, c = torch.randn(500, 4), torch.randn(16, 4)
    whole = assign(x, c)
    monkeypatch.setattr(km, "_CHUNK_ELEMS", 16 * 7)  # 7 rows per chunk
    chunked = assign(x, c)
    assert torch.equal(whole[0], chunked[0]) and torch.allclose(whole[1], chunked[1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.randn(3, 2), 4), "at least 4 points"),
        ((torch.randn(3, 2), 0), "k >= 1"),
        ((torch.randn(3), 1), r"\[N, D\]"),
        ((torch.tensor([[0.0], [float("nan")]]), 1), "NaN"),
    ],
)
def test_kmeans_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        kmeans(*args)


def test_kmeans_rejects_unknown_init():
    with pytest.raises(ValueError, match="unknown k-means init"):
        kmeans(torch.randn(5, 2), 2, init="forgy")


# --- RQ-KMeans -----------------------------------------------------------------------------------
def test_rq_kmeans_residual_error_shrinks_per_level():
    x, _, _ = hierarchical_mixture(300, seed=4)
    rq = fit_rq_kmeans(x, RQKMeansConfig(levels=3, codebook_size=8, seed=0))
    codes = rq.encode(x)
    assert codes.shape == (300, 3) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < 8
    xt = torch.from_numpy(x)
    errors = [float(((rq.reconstruct(codes[:, :l]) - xt) ** 2).sum()) for l in range(4)]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors


def test_rq_kmeans_deterministic_per_seed():
    x, _, _ = hierarchical_mixture(200, seed=5)
    cfg = RQKMeansConfig(levels=2, codebook_size=6, seed=7)
    a, b = fit_rq_kmeans(x, cfg).encode(x), fit_rq_kmeans(x, cfg).encode(x)
    assert torch.equal(a, b)


def test_rq_kmeans_config_errors():
    with pytest.raises(UserInputError, match="levels must be >= 1"):
        fit_rq_kmeans(np.zeros((4, 2)), RQKMeansConfig(levels=0))
    with pytest.raises(UserInputError, match="codebook size must be >= 2"):
        fit_rq_kmeans(np.zeros((4, 2)), RQKMeansConfig(codebook_size=1))


# --- RQ-VAE --------------------------------------------------------------------------------------
def small_rqvae(**overrides) -> RQVAEConfig:
    base = dict(
        latent_dim=8, hidden_dims=(32,), levels=2, codebook_size=4, epochs=30, batch_size=128, lr=3e-3
    )
    return RQVAEConfig(**{**base, **overrides})


def test_rqvae_recovers_top_level_clusters_and_loss_falls():
    x, top, _ = hierarchical_mixture(512, n_top=4, n_sub=4, dim=8, seed=6)
    model, history = train_rqvae(x, small_rqvae(), progress=False)
    codes = model.encode(x).numpy()
    assert codes.shape == (512, 2)
    assert nmi(codes[:, 0], top) > 0.9
    # the latent space moves early on, so compare the last epochs with the first ones
    first = np.mean([h["loss"] for h in history[:3]])
    assert np.mean([h["loss"] for h in history[-3:]]) < 0.5 * first
    assert history[-1]["reconstruction"] < 0.5 * history[0]["reconstruction"]
    assert history[-1]["utilisation"][0] == 1.0
    # decoding more levels reconstructs better
    xt = torch.from_numpy(x)
    errs = [float(((model.reconstruct(codes[:, :l]) - xt) ** 2).mean()) for l in (1, 2)]
    assert errs[1] < errs[0]


def test_rqvae_deterministic_per_seed():
    x, _, _ = hierarchical_mixture(128, seed=7)
    cfg = small_rqvae(epochs=3, seed=3)
    (m1, h1), (m2, h2) = train_rqvae(x, cfg, progress=False), train_rqvae(x, cfg, progress=False)
    assert h1 == h2
    assert torch.equal(m1.encode(x), m2.encode(x))


def test_rqvae_dead_codes_are_reseeded():
    # Without k-means init the random codebook leaves codes unused; the reset must revive some.
    x, _, _ = hierarchical_mixture(256, seed=8)
    _, history = train_rqvae(x, small_rqvae(kmeans_init=False, codebook_size=16, epochs=6), progress=False)
    assert sum(sum(h["dead_codes_reset"]) for h in history) > 0
    assert history[-1]["utilisation"][0] > history[0]["utilisation"][0]
    assert history[-1]["dead_codes_reset"] == [0, 0]  # never after the last epoch


def test_rqvae_config_errors():
    with pytest.raises(UserInputError, match="epochs must be >= 1"):
        train_rqvae(np.zeros((8, 2)), small_rqvae(epochs=0), progress=False)
    with pytest.raises(UserInputError, match="codebook size <= the number of items"):
        train_rqvae(np.zeros((3, 2)), small_rqvae(), progress=False)


# --- statistics ----------------------------------------------------------------------------------
def test_sid_statistics_hand_made():
    codes = np.array([[0, 1], [0, 2], [1, 1], [0, 1]])
    stats = sid_statistics(codes, (4, 4))
    assert stats == {"utilisation": [0.5, 0.5], "codes_used": [2, 2], "distinct_prefixes": [2, 3]}
    unique, sizes, coll = ensure_unique_sids(codes, (4, 4))
    assert sizes == (4, 4, 2)
    assert coll["colliding_items"] == 2 and coll["collision_groups"] == 1 and coll["max_group_size"] == 2
    assert len(np.unique(unique, axis=0)) == 4


# --- pipeline ------------------------------------------------------------------------------------
def test_pipeline_rqkmeans_end_to_end(tiny: Path, tmp_path: Path):
    out = tmp_path / "tok"
    cfg = TokenizeConfig(method="rqkmeans", levels=2, codebook_size=8, progress=False)
    written, stats = tokenize_dataset(tiny, out, cfg)
    assert written == out.resolve()
    src, ds = load_dataset(tiny), load_dataset(out)  # load_dataset rejects duplicate SIDs
    codes = ds.item_codes()
    assert len(np.unique(codes, axis=0)) == ds.num_items
    assert ds.manifest.codebook_sizes == stats["final_codebook_sizes"]
    m = ds.manifest.sid_stats
    assert m["method"] == "rqkmeans" and m["levels"] == 2 and m["codebook_sizes"] == [8, 8]
    assert len(m["utilisation"]) == 2 and all(0 < u <= 1 for u in m["utilisation"])
    assert m["collisions"]["after"]["colliding_items"] == 0
    rel = m["reconstruction"]["relative_by_level"]
    assert rel[1] < rel[0] < 1
    assert ds.manifest.provenance["generator"] == "test_tokenize"
    assert ds.manifest.provenance["tokenized_from"] == str(tiny.resolve())
    assert ds.manifest.provenance["tokenizer"]["method"] == "rqkmeans"
    # everything but the SIDs is carried over
    assert ds.interactions.equals(src.interactions)
    np.testing.assert_array_equal(ds.item_features(), src.item_features())
    assert ds.items["category"].tolist() == src.items["category"].tolist()
    assert src.manifest.codebook_sizes == [240]  # source untouched


def test_pipeline_adds_disambiguation_level(tiny: Path, tmp_path: Path):
    cfg = TokenizeConfig(method="rqkmeans", levels=1, codebook_size=4, progress=False)
    _, stats = tokenize_dataset(tiny, tmp_path / "tok", cfg)
    ds = load_dataset(tmp_path / "tok")
    before = stats["collisions"]["before"]
    assert before["colliding_items"] == 240 and before["distinct_before"] == 4
    assert stats["collisions"]["disambiguation_level"] is True
    assert ds.manifest.codebook_sizes == [4, before["max_group_size"]]
    assert ds.item_codes().shape == (240, 2)


def test_pipeline_rqvae_end_to_end(tiny: Path, tmp_path: Path):
    cfg = TokenizeConfig(
        method="rqvae",
        levels=2,
        codebook_size=4,
        progress=False,
        rqvae=small_rqvae(epochs=4, codebook_size=99),
    )
    _, stats = tokenize_dataset(tiny, tmp_path / "tok", cfg)
    manifest = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    assert manifest["sid_stats"]["method"] == "rqvae"
    assert manifest["sid_stats"]["training"]["epochs"] == 4
    assert manifest["provenance"]["tokenizer"]["params"]["codebook_size"] == 4  # top-level size wins
    assert stats["codebook_sizes"] == [4, 4]
    load_dataset(tmp_path / "tok")


def test_pipeline_overwrite(tiny: Path, tmp_path: Path):
    out = tmp_path / "tok"
    cfg = TokenizeConfig(method="rqkmeans", levels=1, codebook_size=8, progress=False)
    tokenize_dataset(tiny, out, cfg)
    with pytest.raises(DatasetError, match="already exists; pass --overwrite"):
        tokenize_dataset(tiny, out, cfg)
    tokenize_dataset(
        tiny, out, TokenizeConfig(method="rqkmeans", levels=2, codebook_size=8, progress=False), True
    )
    assert load_dataset(out).manifest.sid_stats["levels"] == 2


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (TokenizeConfig(method="vq", progress=False), "unknown tokenizer method 'vq'"),
        (TokenizeConfig(levels=0, progress=False), "--levels must be >= 1"),
        (TokenizeConfig(codebook_size=1, progress=False), "--codebook-size must be >= 2"),
        (TokenizeConfig(levels=4, codebook_size=2**16, progress=False), "overflows the 64-bit SID key"),
        (TokenizeConfig(levels=10**6, codebook_size=2, progress=False), "overflows the 64-bit SID key"),
        (TokenizeConfig(codebook_size=256, progress=False), "240 items but --codebook-size is 256"),
        (TokenizeConfig(rqvae=RQVAEConfig(lr=0), progress=False), "learning rate must be > 0"),
        (TokenizeConfig(rqvae=RQVAEConfig(device="gpu0"), progress=False), "not a torch device"),
    ],
)
def test_pipeline_rejects_bad_parameters(tiny: Path, tmp_path: Path, cfg: TokenizeConfig, message: str):
    before = listing(tmp_path)
    with pytest.raises(UserInputError, match=message):
        tokenize_dataset(tiny, tmp_path / "tok", cfg)
    assert listing(tmp_path) == before  # nothing half-written


def test_pipeline_requires_features(tmp_path: Path):
    write_tiny_dataset(tmp_path / "src", features=False)
    before = listing(tmp_path)
    with pytest.raises(DatasetError, match="no `features` column.*genrec data synth"):
        tokenize_dataset(tmp_path / "src", tmp_path / "tok", TokenizeConfig(progress=False))
    assert listing(tmp_path) == before


def test_pipeline_rejects_missing_source_and_same_folder(tiny: Path, tmp_path: Path):
    with pytest.raises(DatasetError, match="no such dataset folder"):
        tokenize_dataset(tmp_path / "nope", tmp_path / "tok", TokenizeConfig(progress=False))
    with pytest.raises(UserInputError, match="is the source dataset"):
        tokenize_dataset(tiny, tiny, TokenizeConfig(progress=False), overwrite=True)


# --- CLI -----------------------------------------------------------------------------------------
def test_cli_tokenize(tiny: Path, tmp_path: Path, capsys):
    out = tmp_path / "tok"
    argv = ["tokenize", "--data", str(tiny), "--out", str(out), "--method", "rqkmeans"]
    argv += ["--levels", "2", "--codebook-size", "8", "--seed", "1", "--threads", "1", "--no-progress"]
    assert run_cli(argv) == 0
    text = capsys.readouterr().out
    assert "utilisation" in text and "collisions before" in text and str(out.resolve()) in text
    assert load_dataset(out).manifest.sid_stats["method"] == "rqkmeans"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--codebook-size", "1"], "--codebook-size must be >= 2"),
        (["--method", "rqkmeans", "--epochs", "3"], "--epochs only apply to --method rqvae"),
        (["--method", "pq"], "unknown tokenizer method"),
        (["--codebook-size", "1000"], "240 items but --codebook-size is 1000"),
        (["--device", "tpu9"], "not a torch device"),
        (["--threads", "-1"], "--threads must be >= 0"),
    ],
)
def test_cli_bad_input_exits_2(tiny: Path, tmp_path: Path, capsys, extra: list[str], message: str):
    argv = ["tokenize", "--data", str(tiny), "--out", str(tmp_path / "tok"), "--no-progress", *extra]
    assert run_cli(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()


def test_cli_no_features_exits_2(tmp_path: Path, capsys):
    write_tiny_dataset(tmp_path / "src", features=False)
    argv = ["tokenize", "--data", str(tmp_path / "src"), "--out", str(tmp_path / "tok"), "--no-progress"]
    assert run_cli(argv) == 2
    assert "no `features` column" in capsys.readouterr().err


def test_cli_missing_option_is_a_usage_error(tmp_path: Path, capsys):
    assert run_cli(["tokenize", "--out", str(tmp_path / "tok")]) == 2
    assert "--data" in capsys.readouterr().err
