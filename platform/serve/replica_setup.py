"""What a replica builds from its ServeConfig before it answers a request: its DecoderHost's config, every
configured constraint set (built here, once, so requests never pay for a build) and the Limits that
`POST /recommend` bodies are checked against."""

from __future__ import annotations

from genrec.platform.actors import DecoderHost, HostConfig
from genrec.platform.serve.config import ConstraintFields, ServeConfig
from genrec.platform.serve.requests import Limits
from genrec.workloads.errors import UserInputError


def host_config(cfg: ServeConfig) -> HostConfig:
    return HostConfig(
        model=str(cfg.model),
        data=str(cfg.data) if cfg.data else None,
        draft=str(cfg.draft) if cfg.draft else None,
        device=cfg.device,
        threads=cfg.threads,
        decoders=tuple(cfg.decoders),
        defaults=cfg.defaults,
        warmup_batches=cfg.warmup_batches,
    )


def check_constraint_sets(
    host: DecoderHost, cfg: ServeConfig
) -> tuple[dict[str, ConstraintFields], dict[str, str]]:
    """Build every configured set once, for every served decoder that takes a constraint, by decoding a
    history with it (so requests never pay for a build); sets that cannot be built are reported."""
    takers = [name for name, p in host.defaults.items() if hasattr(p, "constraint")]
    history = host.sample_histories(1)
    ok, unavailable = {}, {}
    for set_name, spec in cfg.constraint_sets.items():
        fields = spec.constraint_fields()
        if not takers:
            unavailable[set_name] = f"no served decoder takes a constraint ({list(cfg.decoders)})"
            continue
        try:
            for decoder in takers:
                host.decode(history, decoder, host.resolve(decoder, fields.values())[1])
            ok[set_name] = fields
        except UserInputError as e:
            unavailable[set_name] = f"{decoder}: {e}"
    return ok, unavailable


def request_limits(
    cfg: ServeConfig,
    host: DecoderHost,
    constraint_sets: dict[str, ConstraintFields],
    unavailable_sets: dict[str, str],
) -> Limits:
    """What a request may ask of this replica (`check_constraint_sets` gives the two set maps)."""
    return Limits(
        num_items=host.num_items,
        max_history=host.max_history,
        max_k=cfg.max_k,
        history_policy=cfg.history_policy,
        decoders=tuple(cfg.decoders),
        default_decoder=cfg.decoders[0],
        defaults=dict(host.defaults),
        constraint_sets=constraint_sets,
        unavailable_sets=unavailable_sets,
        max_beam_width=cfg.limits.max_beam_width,
        max_history_items=cfg.limits.max_history_items,
        max_batch_tokens=cfg.limits.max_batch_tokens,
        levels=host.context.codec.levels,
        device=str(host.context.device),
    )
