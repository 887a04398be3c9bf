"""genrec.workloads.tokenize: semantic IDs from item features (RQ-VAE, RQ-KMeans) and `genrec tokenize`."""

# `kmeans` (the function) is not re-exported: it would shadow the submodule of the same name.
from genrec.workloads.tokenize.kmeans import KMeansResult
from genrec.workloads.tokenize.pipeline import TokenizeConfig, tokenize_dataset
from genrec.workloads.tokenize.rqkmeans import RQKMeans, RQKMeansConfig, fit_rq_kmeans
from genrec.workloads.tokenize.rqvae import RQVAE, RQVAEConfig, train_rqvae

__all__ = [
    "RQVAE",
    "KMeansResult",
    "RQKMeans",
    "RQKMeansConfig",
    "RQVAEConfig",
    "TokenizeConfig",
    "fit_rq_kmeans",
    "tokenize_dataset",
    "train_rqvae",
]
