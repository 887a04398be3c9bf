"""RQ-VAE semantic IDs (TIGER-style): MLP encoder -> residual quantiser -> MLP decoder.

The encoder maps standardised item features to a latent z of size d. Level l of the residual
quantiser picks the nearest of T code vectors to the residual left by levels 1..l-1; the SID is
the list of picked indices and the sum of the picked vectors is the quantised latent, which the
decoder maps back to the features. Training minimises

    reconstruction MSE + sum_l ||sg[r_l] - e_l||^2 + beta * sum_l ||r_l - sg[e_l]||^2

(codebook loss pulls codes to the residuals; the commitment loss keeps the encoder near its
codes), and a straight-through estimator passes the decoder's gradient to the encoder across the
non-differentiable nearest-code step. Each codebook starts from k-means on the residuals of the
initial encoder's latents, and codes left unused for an epoch are re-seeded on real residuals so
the codebook does not collapse onto a few codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from genrec.workloads.errors import UserInputError
from genrec.workloads.progress import bar_enabled
from genrec.workloads.tokenize.kmeans import assign, make_generator
from genrec.workloads.tokenize.rqkmeans import RQKMeansConfig, as_points, fit_rq_kmeans

_ENCODE_BATCH = 65536  # rows per no-grad forward pass when encoding a whole catalogue


@dataclass
class RQVAEConfig:
    latent_dim: int = 32
    hidden_dims: tuple[int, ...] = (256, 128)
    levels: int = 3
    codebook_size: int = 256
    beta: float = 0.25  # commitment weight
    epochs: int = 100
    batch_size: int = 256
    lr: float = 1e-3
    # Codebook vectors have to follow a latent space that moves as the encoder learns; Adam moves
    # each coordinate by about lr per step, so at the networks' rate the codes lag and the
    # codebook loss climbs. A larger rate for the codebooks keeps them on the latents.
    codebook_lr: float = 1e-2
    weight_decay: float = 0.0
    seed: int = 0
    kmeans_init: bool = True
    kmeans_iters: int = 25
    dead_code_reset: bool = True
    dead_code_sample: int = 4096  # items whose residuals re-seed dead codes
    standardize: bool = True  # z-score each feature dimension before the encoder
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.hidden_dims = tuple(int(h) for h in self.hidden_dims)

    def validate(self) -> None:
        checks = [
            (self.levels >= 1, f"levels must be >= 1, got {self.levels}"),
            (self.codebook_size >= 2, f"codebook size must be >= 2, got {self.codebook_size}"),
            (self.latent_dim >= 1, f"latent_dim must be >= 1, got {self.latent_dim}"),
            (all(h >= 1 for h in self.hidden_dims), f"hidden dims must be >= 1, got {self.hidden_dims}"),
            (self.beta >= 0, f"beta must be >= 0, got {self.beta}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (self.lr > 0, f"learning rate must be > 0, got {self.lr}"),
            (self.codebook_lr > 0, f"codebook learning rate must be > 0, got {self.codebook_lr}"),
            (self.weight_decay >= 0, f"weight decay must be >= 0, got {self.weight_decay}"),
            (self.kmeans_iters >= 0, f"k-means iterations must be >= 0, got {self.kmeans_iters}"),
            (self.dead_code_sample >= 1, f"dead_code_sample must be >= 1, got {self.dead_code_sample}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserInputError(message)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden_dims"] = list(self.hidden_dims)
        return d


def mlp(dims: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@dataclass
class QuantizerOutput:
    quantized: torch.Tensor  # [B, d] sum of the chosen code vectors (carries codebook gradient)
    codes: torch.Tensor  # [B, L] int64
    codebook_loss: torch.Tensor
    commitment_loss: torch.Tensor


class ResidualQuantizer(nn.Module):
    def __init__(self, levels: int, codebook_size: int, dim: int) -> None:
        super().__init__()
        # Small random start; k-means initialisation normally overwrites it.
        self.codebooks = nn.Parameter(torch.randn(levels, codebook_size, dim) / dim**0.5)

    @property
    def levels(self) -> int:
        return self.codebooks.shape[0]

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        residual = z
        quantized = torch.zeros_like(z)
        codes = []
        codebook_loss = z.new_zeros(())
        commitment_loss = z.new_zeros(())
        for level in range(self.levels):
            book = self.codebooks[level]
            idx, _ = assign(residual.detach(), book.detach())
            e = book[idx]
            codebook_loss = codebook_loss + F.mse_loss(e, residual.detach())
            commitment_loss = commitment_loss + F.mse_loss(residual, e.detach())
            quantized = quantized + e
            # Detached so each codebook is trained by its own level's loss only.
            residual = residual - e.detach()
            codes.append(idx)
        return QuantizerOutput(quantized, torch.stack(codes, 1), codebook_loss, commitment_loss)

    def level_residuals(self, z: torch.Tensor) -> list[torch.Tensor]:
        """The residual each level quantises (level 0 sees z itself)."""
        out, residual = [], z
        for level in range(self.levels):
            out.append(residual)
            idx, _ = assign(residual, self.codebooks[level].detach())
            residual = residual - self.codebooks[level].detach()[idx]
        return out

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """[N, l] codes (a prefix of the levels) -> [N, d] sum of their code vectors."""
        out = torch.zeros(codes.shape[0], self.codebooks.shape[2], device=codes.device)
        for level in range(codes.shape[1]):
            out += self.codebooks[level][codes[:, level]]
        return out


@dataclass
class RQVAEOutput:
    reconstruction: torch.Tensor  # [B, D] in standardised feature space
    codes: torch.Tensor
    reconstruction_loss: torch.Tensor
    codebook_loss: torch.Tensor
    commitment_loss: torch.Tensor
    loss: torch.Tensor


class RQVAE(nn.Module):
    def __init__(self, input_dim: int, config: RQVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = mlp([input_dim, *config.hidden_dims, config.latent_dim])
        self.decoder = mlp([config.latent_dim, *reversed(config.hidden_dims), input_dim])
        self.quantizer = ResidualQuantizer(config.levels, config.codebook_size, config.latent_dim)
        self.register_buffer("feature_mean", torch.zeros(input_dim))
        self.register_buffer("feature_std", torch.ones(input_dim))

    def set_standardisation(self, x: torch.Tensor) -> None:
        if self.config.standardize:
            std = x.std(0, unbiased=False)
            self.feature_mean.copy_(x.mean(0))
            # A constant dimension carries no information; leave it unscaled rather than divide by 0.
            self.feature_std.copy_(torch.where(std > 1e-8, std, torch.ones_like(std)))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.feature_mean) / self.feature_std

    def denormalise(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.feature_std + self.feature_mean

    def forward(self, x_norm: torch.Tensor) -> RQVAEOutput:
        """x_norm: standardised features. Loss terms are the ones in the module docstring."""
        z = self.encoder(x_norm)
        q = self.quantizer(z)
        z_st = z + (q.quantized - z).detach()  # straight-through: decoder gradient reaches the encoder
        recon = self.decoder(z_st)
        recon_loss = F.mse_loss(recon, x_norm)
        loss = recon_loss + q.codebook_loss + self.config.beta * q.commitment_loss
        return RQVAEOutput(recon, q.codes, recon_loss, q.codebook_loss, q.commitment_loss, loss)

    def _device(self) -> torch.device:
        return self.feature_mean.device

    @torch.no_grad()
    def encode(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[N, D] raw features -> [N, L] int64 codes."""
        x = as_points(features, self._device())
        parts = [
            self.quantizer(self.encoder(self.normalise(x[i : i + _ENCODE_BATCH]))).codes
            for i in range(0, len(x), _ENCODE_BATCH)
        ]
        return torch.cat(parts) if parts else torch.zeros(0, self.quantizer.levels, dtype=torch.int64)

    @torch.no_grad()
    def reconstruct(self, codes: np.ndarray | torch.Tensor) -> torch.Tensor:
        """[N, l] codes (any prefix of the levels) -> [N, D] decoded features in the raw scale."""
        codes = torch.as_tensor(np.asarray(codes) if not isinstance(codes, torch.Tensor) else codes)
        codes = codes.to(device=self._device(), dtype=torch.int64)
        if codes.ndim != 2 or codes.shape[1] > self.quantizer.levels:
            raise ValueError(f"expected [N, <= {self.quantizer.levels}] codes, got shape {list(codes.shape)}")
        return self.denormalise(self.decoder(self.quantizer.lookup(codes)))


# --- training ------------------------------------------------------------------------------------
@torch.no_grad()
def kmeans_init_codebooks(model: RQVAE, x_norm: torch.Tensor, config: RQVAEConfig) -> None:
    """Set each codebook to k-means centres of that level's residuals under the initial encoder."""
    z = model.encoder(x_norm)
    rq = fit_rq_kmeans(
        z,
        RQKMeansConfig(
            config.levels, config.codebook_size, config.kmeans_iters, seed=config.seed, device=str(z.device)
        ),
    )
    model.quantizer.codebooks.copy_(torch.stack(rq.codebooks))


@torch.no_grad()
def reset_dead_codes(
    model: RQVAE, x_norm: torch.Tensor, dead: torch.Tensor, sample: int, generator: torch.Generator
) -> list[int]:
    """Move codes unused in the last epoch (dead[l, t]) onto randomly drawn residuals of their level.

    Levels are handled in order because re-seeding level l changes the residuals of level l+1.
    Returns the number of codes reset per level.
    """
    pick = torch.randperm(len(x_norm), generator=generator, device=x_norm.device)[:sample]
    residual = model.encoder(x_norm[pick])
    books = model.quantizer.codebooks
    reset = []
    for level in range(books.shape[0]):
        idx = torch.nonzero(dead[level]).squeeze(1)
        if len(idx):
            rows = torch.randint(len(residual), (len(idx),), generator=generator, device=residual.device)
            books[level, idx] = residual[rows]
        reset.append(len(idx))
        labels, _ = assign(residual, books[level])
        residual = residual - books[level][labels]
    return reset


def rqvae_optimiser(model: RQVAE, config: RQVAEConfig) -> torch.optim.Optimizer:
    """Adam with its own learning rate (and no weight decay) for the codebooks."""
    networks = [p for name, p in model.named_parameters() if not name.startswith("quantizer.")]
    return torch.optim.Adam(
        [
            {"params": networks, "lr": config.lr, "weight_decay": config.weight_decay},
            {"params": list(model.quantizer.parameters()), "lr": config.codebook_lr, "weight_decay": 0.0},
        ]
    )


def train_epoch(
    model: RQVAE,
    optimiser: torch.optim.Optimizer,
    x_norm: torch.Tensor,
    config: RQVAEConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the points in a random order: the mean (loss, reconstruction, codebook, commitment)
    [4] and how often each code was used [levels, codebook_size]."""
    n, levels, size = len(x_norm), config.levels, config.codebook_size
    level_offset = torch.arange(levels, device=x_norm.device) * size  # one bincount counts every level
    perm = torch.randperm(n, generator=generator, device=x_norm.device)
    usage = torch.zeros(levels, size, dtype=torch.int64, device=x_norm.device)
    # Loss sums stay on the device so a GPU step does not wait for a host copy.
    sums = torch.zeros(4, device=x_norm.device)
    for start in range(0, n, config.batch_size):
        batch = x_norm[perm[start : start + config.batch_size]]
        out = model(batch)
        optimiser.zero_grad(set_to_none=True)
        out.loss.backward()
        optimiser.step()
        terms = (out.loss, out.reconstruction_loss, out.codebook_loss, out.commitment_loss)
        sums += torch.stack(terms).detach() * (len(batch) / n)
        codes = (out.codes + level_offset).flatten()
        usage += torch.bincount(codes, minlength=levels * size).view(levels, size)
    return sums, usage


def train_rqvae(
    features: np.ndarray | torch.Tensor, config: RQVAEConfig, progress: bool = True
) -> tuple[RQVAE, list[dict]]:
    """Train an RQ-VAE on [N, D] item features. Deterministic for a given seed on CPU.

    Returns the model (in eval mode) and one history dict per epoch with the mean losses, the
    per-level codebook utilisation during the epoch and the dead codes re-seeded after it.
    """
    config.validate()
    x = as_points(features, config.device)
    n = len(x)
    if config.kmeans_init and n < config.codebook_size:
        raise UserInputError(
            f"{n} items cannot initialise a codebook of {config.codebook_size} codes; "
            "use a codebook size <= the number of items"
        )
    with torch.random.fork_rng(devices=[]):  # seed the weight init without touching global RNG state
        torch.manual_seed(config.seed)
        model = RQVAE(x.shape[1], config).to(config.device)
    model.set_standardisation(x)
    x_norm = model.normalise(x)
    if config.kmeans_init:
        kmeans_init_codebooks(model, x_norm, config)

    generator = make_generator(config.seed, config.device)
    optimiser = rqvae_optimiser(model, config)
    history: list[dict] = []
    bar = tqdm(range(config.epochs), desc="rq-vae epochs", disable=not bar_enabled(progress))
    model.train()
    for epoch in bar:
        sums, usage = train_epoch(model, optimiser, x_norm, config, generator)
        dead = usage == 0
        reset = [0] * config.levels
        # Not after the last epoch: a re-seeded code would not be trained, and encode() must match.
        if config.dead_code_reset and epoch < config.epochs - 1 and dead.any():
            reset = reset_dead_codes(model, x_norm, dead, config.dead_code_sample, generator)
        entry = {
            "epoch": epoch,
            **dict(zip(("loss", "reconstruction", "codebook", "commitment"), sums.tolist(), strict=True)),
            "utilisation": [float(u) for u in (~dead).float().mean(1)],
            "dead_codes_reset": reset,
        }
        history.append(entry)
        bar.set_postfix(loss=f"{entry['loss']:.4f}", util=f"{min(entry['utilisation']):.2f}")
    model.eval()
    return model, history
