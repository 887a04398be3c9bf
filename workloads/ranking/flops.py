"""FLOPs closed forms of MaRI appendix B (a multiply-add counts 2, as torch's FlopCounterMode does).

B.2, one fusion MatMul of width d over [user | item | cross]:
    vanilla (user tiled to B rows)   2 B d (Du + Di + Dc)                       eq. 8
    MaRI (eq. 7)                     2 d (Du + B (Di + Dc))                     eq. 9
B.1, single-head cross-attention projections (query count 1, width d, sequence length L); the paper
writes these without the factor 2:
    VanI (sequence tiled to B)       2 B d^2 (1 + 2L)
    UOI (keys/values once)           2 (B d^2 + 2 L d^2)
"""

from __future__ import annotations

from collections.abc import Callable


def matmul_flops_vanilla(b: int, d_user: int, d_item: int, d_cross: int, d_hidden: int) -> int:
    return 2 * b * d_hidden * (d_user + d_item + d_cross)


def matmul_flops_mari(b: int, d_user: int, d_item: int, d_cross: int, d_hidden: int) -> int:
    return 2 * d_hidden * (d_user + b * (d_item + d_cross))


def flops_speedup(b: int, d_user: int, d_item: int, d_cross: int, d_hidden: int) -> float:
    return matmul_flops_vanilla(b, d_user, d_item, d_cross, d_hidden) / matmul_flops_mari(
        b, d_user, d_item, d_cross, d_hidden
    )


def attention_projection_flops_vani(b: int, seq_len: int, d: int) -> int:
    return 2 * b * d * d * (1 + 2 * seq_len)


def attention_projection_flops_uoi(b: int, seq_len: int, d: int) -> int:
    return 2 * (b * d * d + 2 * seq_len * d * d)


def counted_flops(fn: Callable[[], object]) -> int:
    """FLOPs torch dispatches while running fn (matmul-family ops only)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())
