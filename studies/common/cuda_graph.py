"""Capturing a benchmark's call as a CUDA graph, so its replay pays no per-kernel launch cost."""

from __future__ import annotations

import torch


def capture_cuda_graph(fn, dev: torch.device) -> tuple:
    """(replay, static output) of fn captured as a CUDA graph on fixed inputs (warm-up on a side stream
    first, as capture requires)."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out
