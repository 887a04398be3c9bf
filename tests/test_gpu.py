"""CUDA checks, run on a lent GPU machine (`pytest -m gpu`); skipped where there is no GPU."""

import numpy as np
import pytest
import torch

from genrec.workloads.decoding.base import DecoderContext, get_decoder, make_params
from genrec.workloads.models.model_config import ModelConfig
from genrec.workloads.models.transformer import GRTransformer
from genrec.workloads.sid_codec import SIDCodec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def make_ctx(device):
    codec = SIDCodec((16, 16, 16))
    rng = np.random.default_rng(0)
    codes = codec.keys_to_codes(rng.choice(codec.num_sids, size=500, replace=False))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=codec.vocab_size, dim=64, n_layers=2, n_heads=4, max_seq_len=256)
    model = GRTransformer(cfg)
    return DecoderContext(model.to(device).eval(), codec, codes, 10)


def test_beam_search_on_cuda_matches_cpu():
    histories = [list(np.random.default_rng(i).integers(0, 500, size=8)) for i in range(6)]
    beam = get_decoder("beam")
    params = make_params(beam, {"beam_width": 20, "k": 10})
    cpu = beam.decode(make_ctx("cpu"), histories, params)
    gpu = beam.decode(make_ctx("cuda"), histories, params)
    torch.testing.assert_close(gpu.scores.cpu(), cpu.scores, atol=1e-3, rtol=1e-3)
    assert (gpu.codes.cpu() == cpu.codes).float().mean() > 0.95  # ties may reorder a few
    assert gpu.timings_ms["decode"] > 0


def test_bf16_training_step_on_cuda_reduces_loss():
    from genrec.workloads.training.trainer import target_loss

    torch.manual_seed(0)
    model = GRTransformer(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(3, 64, (8, 12))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    labels = torch.roll(tokens, -1, dims=1)
    labels[:, -1] = -100
    losses = []
    for _ in range(20):
        loss = target_loss(model, tokens, mask, labels, torch.device("cuda"), autocast=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7


@pytest.mark.parametrize("verify", ["final", "every", "none"])
@pytest.mark.parametrize("dense", [True, False])
def test_nezha_head_search_on_cuda_matches_cpu(verify, dense):
    from genrec.workloads.decoding.base import ItemIndex
    from genrec.workloads.decoding.nezha import head_beam_search
    from genrec.workloads.decoding.prefix_keys import PrefixKeySets
    from genrec.workloads.models.nezha_head import HeadConfig, build_head

    codec = SIDCodec((16, 16, 16))
    rng = np.random.default_rng(1)
    items = codec.keys_to_codes(rng.choice(codec.num_sids, size=300, replace=False))
    torch.manual_seed(0)
    head = build_head(HeadConfig.for_variant("nezha", 32, codec.codebook_sizes, "full")).eval()
    states = torch.randn(6, codec.levels + 1, 32)
    out = {}
    for device in ("cpu", "cuda"):
        # dense: per-level child tables; otherwise the search path of large catalogues
        keys = ItemIndex(codec, items, device).keys
        sets = PrefixKeySets(codec, keys, max_child_table=1 << 20 if dense else 0)
        with torch.no_grad():
            out[device] = head_beam_search(head.to(device), states.to(device), 10, codec, sets, verify)
    cpu, gpu = out["cpu"], out["cuda"]
    torch.testing.assert_close(gpu.scores.cpu(), cpu.scores, atol=1e-4, rtol=1e-4)
    # slots that verification emptied (score -inf) hold arbitrary codes; ties may reorder a few others
    kept = torch.isfinite(cpu.scores)
    assert (gpu.codes.cpu() == cpu.codes).all(dim=-1)[kept].float().mean() > 0.95
    assert gpu.drafts_valid == cpu.drafts_valid
