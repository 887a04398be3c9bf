"""genrec.workloads.tokenize: semantic IDs from item features (RQ-VAE, RQ-KMeans) and `genrec tokenize`;
for imported checkpoints, their SID tokens (sid_tokens), prompt template (prompt_template) and a level's
scores (level_scores)."""

# `kmeans` (the function) is not re-exported: it would shadow the submodule of the same name.
from genrec.workloads.tokenize.kmeans import KMeansResult
from genrec.workloads.tokenize.pipeline import TokenizeConfig, tokenize_dataset
from genrec.workloads.tokenize.prompt_template import PromptEncoder, PromptTemplate
from genrec.workloads.tokenize.rqkmeans import RQKMeans, RQKMeansConfig, fit_rq_kmeans
from genrec.workloads.tokenize.rqvae import RQVAE, RQVAEConfig, train_rqvae
from genrec.workloads.tokenize.sid_tokens import (
    SIDPattern,
    load_sid_table,
    sid_pattern,
    sid_table_from_tokenizer,
)

__all__ = [
    "RQVAE",
    "KMeansResult",
    "PromptEncoder",
    "PromptTemplate",
    "RQKMeans",
    "RQKMeansConfig",
    "RQVAEConfig",
    "SIDPattern",
    "TokenizeConfig",
    "fit_rq_kmeans",
    "load_sid_table",
    "sid_pattern",
    "sid_table_from_tokenizer",
    "tokenize_dataset",
    "train_rqvae",
]
