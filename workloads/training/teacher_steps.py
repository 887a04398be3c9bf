"""All-step teacher data: the target's beam after every SID level, not only the final top-K.

The paper's Table 5 ("w/ AD") trains the draft on "beam sequences from different steps" as well as on
the final top-K. Strict verification accepts drafted level t when the target's K beams after level t
are among the draft's N beams there; those K prefixes are not, in general, the prefixes of the final
top-K SIDs (a step-t beam may have no descendant in the final K, and the final K may share prefixes),
so aligning on them targets what acceptance checks.

`genrec atspeed teacher --all-steps` stores them beside the final SIDs: per example a `step_codes`
column of [L - 1][K][L] codes, step t's K beams (t = 1..L-1, best first), each a prefix of t codes
padded with -1, and all -1 where the step kept fewer than K beams (fewer valid prefixes than K). The
final step is the file's `codes` column. Kinds "beam" (the target's constrained beam search) and
"sample" (its sampling beam search at temperature 1, drawn exactly as the plain sample file draws it,
so both files hold the same final SIDs for the same seed); not "mixture".
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from genrec.workloads.decoding.base import DecoderContext, DecodeResult
from genrec.workloads.decoding.beam import BeamSample, BeamSampleParams, BeamSearch
from genrec.workloads.decoding.beam_core import level_beams
from genrec.workloads.decoding.params import BeamParams
from genrec.workloads.errors import UserInputError

STEP_COLUMN = "step_codes"
MISSING = -1  # a code past a step's prefix, or a whole beam a step could not fill


def beam_with_steps(
    ctx: DecoderContext, prompts: list[list[int]], params: BeamParams
) -> tuple[DecodeResult, np.ndarray]:
    """What the `beam` decoder returns for `params` (`beam_sample` for BeamSampleParams), and the beams
    it kept after every level but the last: [B, L - 1, W, L] codes, MISSING past step t's t codes and
    where step t kept fewer than W beams."""
    decoder = BeamSample() if isinstance(params, BeamSampleParams) else BeamSearch()
    search, result = decoder.decode_search(ctx, prompts, params)
    levels, width = ctx.codec.levels, params.beam_width
    steps = np.full((len(prompts), levels - 1, width, levels), MISSING, dtype=np.int64)
    for t, (codes, scores) in enumerate(level_beams(search.choices)[:-1]):
        found = torch.isfinite(scores).cpu().numpy()
        steps[:, t, :, : t + 1] = np.where(found[..., None], codes.cpu().numpy(), MISSING)
    return result, steps


def read_step_codes(table: pa.Table, n: int, k: int, levels: int, where: object) -> np.ndarray:
    """The `step_codes` column back as [N, L - 1, K, L], its shape checked."""
    if STEP_COLUMN not in table.column_names:
        raise UserInputError(f"{where}: all_steps in its manifest but no {STEP_COLUMN} column; rebuild it")
    col = table.column(STEP_COLUMN).combine_chunks()
    per_step = col.flatten()
    per_beam = per_step.flatten()
    ok = (
        pc.all(pc.equal(pc.list_value_length(col), levels - 1)).as_py()
        and pc.all(pc.equal(pc.list_value_length(per_step), k)).as_py()
        and pc.all(pc.equal(pc.list_value_length(per_beam), levels)).as_py()
    )
    if not ok:
        shape = f"{levels - 1} steps of {k} beams of {levels} codes"
        raise UserInputError(f"{where}: every {STEP_COLUMN} row must hold {shape}; rebuild it")
    return per_beam.flatten().to_numpy().astype(np.int64).reshape(n, levels - 1, k, levels)


def step_coverage(codes: np.ndarray, step_codes: np.ndarray) -> list[float]:
    """Per step t = 1..L-1, the share of the target's kept step-t beams that are a prefix of one of the
    final top-K SIDs (codes [N, K, L], step_codes [N, L - 1, K, L]): how much of what strict
    verification checks at level t the final top-K alone would teach."""
    out = []
    for t in range(step_codes.shape[1]):
        beams, finals = step_codes[:, t, :, : t + 1], codes[:, :, : t + 1]
        descends = (beams[:, :, None, :] == finals[:, None, :, :]).all(-1).any(-1)  # [N, K]
        kept = beams[..., 0] != MISSING
        out.append(float(descends[kept].mean()) if kept.any() else float("nan"))
    return out
