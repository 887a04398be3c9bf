"""MaRI ranking workload: a multi-task ranking model scored one user against B candidates, three inference
modes over the same weights (VanI, UOI, MaRI), the graph colouring pass that finds the MatMuls MaRI may
re-parameterise, feature-layout reorganisation, FLOPs closed forms, synthetic click data and training.

Modules: model (the network and its config), gca (colouring + rewrite on a torch.fx graph), modes (the
`RankingScorer.score(user, items, cross, mode)` entry point), layout (fragmented -> neat columns),
flops (appendix B closed forms), synth (seeded click data), train (a short BCE training loop).
"""
