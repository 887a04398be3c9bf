"""genrec.workloads.tokenize: semantic IDs from item features (RQ-VAE, RQ-KMeans) and `genrec tokenize`;
for imported checkpoints, their SID tokens (sid_tokens), prompt template (prompt_template) and a level's
scores (level_scores)."""
