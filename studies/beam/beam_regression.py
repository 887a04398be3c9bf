"""This checkout's beam search against an older commit's, side by side in one process (no-regression check).

    python -m genrec.studies.beam.beam_regression --baseline-commit a46524b \\
        --beam-widths 5 20 50 --batch-sizes 1 16 --repeats 15 --threads 1 [--out FILE.json]

The baseline's `workloads/` and `kernels/` are exported from git (`git archive COMMIT`) into a temporary
folder and imported as the package `genrec_old` (its `genrec.` imports rewritten), so both versions run
in one process on the same random `small` weights, prompts and histories: the arms alternate order every
repeat, and per-repeat ratios (baseline / current wall time, > 1 = the current code is faster) are
summarised by their median and 10th/90th percentiles. The top-K SIDs of both must be identical
(scores within 1e-4) or the run fails. Also reported: the current search overhead share
(decode - decode_forward) / decode. Needs a git checkout of this repository.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from genrec.studies.common.options import add_shared_options
from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.errors import UserInputError, run_main
from genrec.workloads.models.model_config import model_config_for
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.results import benchmark_summary
from genrec.workloads.sid_codec import SIDCodec

MODULE = "genrec.studies.beam.beam_regression"
REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--baseline-commit", required=True, help="the git commit to compare against")
    p.add_argument("--codebooks", type=int, nargs="+", default=[256, 256, 256, 4])
    p.add_argument("--items", type=int, default=12000)
    p.add_argument("--history", type=int, default=20)
    p.add_argument("--model-size", default="small")
    p.add_argument("--beam-widths", type=int, nargs="+", default=[5, 20, 50])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    add_shared_options(
        p,
        repeats=15,
        warmup=2,
        threads=1,
    )
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def export_baseline(commit: str, into: Path) -> None:
    """`git archive` the baseline's workloads/ and kernels/ into INTO/genrec_old, imports renamed."""
    pkg = into / "genrec_old"
    pkg.mkdir(parents=True)
    try:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit, "workloads", "kernels"],
            check=True,
            capture_output=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise UserInputError(
            f"cannot export commit {commit!r} from {REPO} with git ({e}); give a commit of this repo"
        ) from None
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=tar, check=True)
    (pkg / "__init__.py").write_text("")
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        path.write_text(
            text.replace("genrec.workloads", "genrec_old.workloads").replace(
                "genrec.kernels", "genrec_old.kernels"
            )
        )


def contexts(args, old) -> tuple[DecoderContext, object]:
    """The same random model and catalogue in the current code and in the baseline."""
    codec = SIDCodec(tuple(args.codebooks))
    rng = np.random.default_rng(0)
    items = codec.keys_to_codes(rng.choice(codec.num_sids, args.items, replace=False))
    torch.manual_seed(0)
    prompt = (args.history + 1) * codec.levels + 2
    model = GRTransformer(model_config_for(args.model_size, codec.vocab_size, prompt)).eval()
    o_tr = old.import_module("genrec_old.workloads.models.transformer")
    o_model = o_tr.GRTransformer(o_tr.model_config_for(args.model_size, codec.vocab_size, prompt)).eval()
    o_model.load_state_dict(model.state_dict())
    o_codec = old.import_module("genrec_old.workloads.sid_codec").SIDCodec(tuple(args.codebooks))
    o_base = old.import_module("genrec_old.workloads.decoding.base")
    return DecoderContext(model, codec, items, args.history), o_base.DecoderContext(
        o_model, o_codec, items, args.history
    )


def compare(args, ctx, o_ctx, o_base, batch: int, width: int, rng) -> dict:
    hists = [list(rng.integers(0, args.items, args.history)) for _ in range(batch)]
    new, old = get_decoder("beam"), o_base.get_decoder("beam")
    pn = make_params(new, {"beam_width": width, "k": min(10, width)})
    po = o_base.make_params(old, {"beam_width": width, "k": min(10, width)})
    a, b = new.decode(ctx, hists, pn), old.decode(o_ctx, hists, po)
    if not torch.equal(a.codes, b.codes) or not torch.allclose(a.scores, b.scores, atol=1e-4):
        raise SystemExit(f"batch {batch} width {width}: the top-K differs from the baseline's")
    times: list[list[float]] = [[], []]
    overhead = []
    for r in range(args.warmup + args.repeats):
        for arm in (0, 1) if r % 2 == 0 else (1, 0):
            t0 = time.perf_counter_ns()
            res = new.decode(ctx, hists, pn) if arm == 0 else old.decode(o_ctx, hists, po)
            ms = (time.perf_counter_ns() - t0) / 1e6
            if r >= args.warmup:
                times[arm].append(ms)
                if arm == 0:
                    t = res.timings_ms
                    overhead.append((t["decode"] - t["decode_forward"]) / t["decode"])
    ratio = np.asarray(times[1]) / np.asarray(times[0])
    return {
        "current_ms": float(np.median(times[0])),
        "baseline_ms": float(np.median(times[1])),
        "baseline_over_current": float(np.median(ratio)),
        "ratio_p10": float(np.percentile(ratio, 10)),
        "ratio_p90": float(np.percentile(ratio, 90)),
        "search_overhead_share": float(np.median(overhead)),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        export_baseline(args.baseline_commit, Path(tmp))
        sys.path.insert(0, tmp)
        try:
            ctx, o_ctx = contexts(args, importlib)
            o_base = importlib.import_module("genrec_old.workloads.decoding.base")
            rng = np.random.default_rng(1)
            for batch in args.batch_sizes:
                for width in args.beam_widths:
                    row = compare(args, ctx, o_ctx, o_base, batch, width, rng)
                    rows[f"b{batch}_w{width}"] = row
                    print(
                        f"batch {batch:3d} width {width:3d}: current {row['current_ms']:8.2f} ms  "
                        f"baseline {row['baseline_ms']:8.2f} ms  "
                        f"baseline/current {row['baseline_over_current']:.3f} "
                        f"[p10 {row['ratio_p10']:.3f}, p90 {row['ratio_p90']:.3f}]  "
                        f"search overhead {row['search_overhead_share']:.3f}",
                        flush=True,
                    )
        finally:
            sys.path.remove(tmp)
    return benchmark_summary(MODULE, argv, torch.device("cpu"), args, rows, args.out)


if __name__ == "__main__":
    run_main(main)
