"""genrec.workloads.tokenize: semantic IDs from item features (RQ-VAE, RQ-KMeans) and `genrec tokenize`."""
