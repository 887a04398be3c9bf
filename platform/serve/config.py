"""Serve configuration: the app's arguments (`ServeConfig`) and the config file that holds them.

The config file is Ray Serve's own format (`serve build` / `serve deploy` read it), so one file
drives both `genrec serve --config serve.yaml` and `serve deploy serve.yaml` on a cluster:

    http_options: {host: 127.0.0.1, port: 8000}
    applications:
      - name: genrec
        import_path: genrec.platform.serve.app:build_app
        args: {model: runs/models/tiny, decoders: [beam, static], max_batch_size: 16, ...}

`draft: DIR` (AtSpeed) loads a draft model beside the model in every replica; decoders that need one
(atspeed_*) are refused in `decoders` without it.

`args` is a `ServeConfig`. Batching settings (`batching`: the policy, `fixed` or `slo`, and its
settings) are the deployment's `user_config`, so `serve deploy` of a changed file applies them live,
without restarting replicas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from genrec.platform.experiment_loading import format_validation_error
from genrec.workloads.decoding.draft import (
    check_same_codec,
    checkpoint_codebook_sizes,
    draft_needed_message,
    needs_draft,
)
from genrec.workloads.decoding.params import CONSTRAINT_RULES, SIZED_RULES, BeamParams
from genrec.workloads.errors import UserInputError
from genrec.workloads.serving.slo import DEFAULT_SLO_MS
from genrec.workloads.serving.xschedule import ScheduleConfig

DEFAULT_HOST = "127.0.0.1"  # local only unless the config says otherwise
DEFAULT_PORT = 8000
APP_IMPORT_PATH = "genrec.platform.serve.app:build_app"
DEPLOYMENT_NAME = "Recommender"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ConstraintFields:
    """The constraint fields of a beam-based decoder's Params, keeping only those its rule reads (so
    two requests for the same set compare equal whatever they left at their defaults)."""

    constraint: str = "none"
    constraint_size: int = 0
    constraint_seed: int = 0
    constraint_path: str = ""

    @classmethod
    def of(cls, params: Any) -> ConstraintFields:
        rule = params.constraint
        sized = rule in SIZED_RULES
        return cls(
            constraint=rule,
            constraint_size=params.constraint_size if sized else 0,
            constraint_seed=params.constraint_seed if sized else 0,
            constraint_path=params.constraint_path if rule == "file" else "",
        )

    def values(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.constraint in SIZED_RULES:
            return f"{self.constraint!r} (size {self.constraint_size}, seed {self.constraint_seed})"
        if self.constraint == "file":
            return f"'file' ({self.constraint_path})"
        return repr(self.constraint)


class ConstraintSetSpec(_Strict):
    """A constraint set requests can name (`constraint`); any served beam-based decoder decodes with it."""

    rule: Literal[CONSTRAINT_RULES] = "all"  # the one list of rules (workloads/decoding/params.py)
    size: int = 0  # random / uniform: how many SIDs
    seed: int = 0  # random / uniform
    path: str = ""  # file: a .npy or text list of SIDs

    @model_validator(mode="after")
    def _complete(self) -> ConstraintSetSpec:
        try:  # the rules' own checks (size for random, path for file), worded as for any parameter
            BeamParams(**self.constraint_fields().values()).validate()
        except UserInputError as e:
            raise ValueError(str(e)) from None
        return self

    def constraint_fields(self) -> ConstraintFields:
        return ConstraintFields(self.rule, self.size, self.seed, self.path)


class BatchingConfig(_Strict):
    """The deployment's user_config: changeable live. `policy` picks the batcher:
    - fixed: Serve's `@serve.batch`, up to `max_batch_size` requests, waiting at most
      `batch_wait_timeout_s` for a batch to fill;
    - slo: xSchedule (genrec.workloads.serving.xschedule): batches of at most `token_budget` tokens
      (prompt tokens x beams), dispatched when the budget fills or the oldest request has waited
      `wait_quota_ms`; a request predicted to miss `slo_ms` is answered 503 + Retry-After at once.
    """

    policy: Literal["fixed", "slo"] = "fixed"
    max_batch_size: int = Field(16, ge=1, le=4096)  # fixed: 1 = batching off; both: the admission bound
    batch_wait_timeout_s: float = Field(0.005, ge=0, le=10)  # fixed
    token_budget: int = Field(65536, ge=1)  # slo: tokens per batch
    slo_ms: float = Field(DEFAULT_SLO_MS, gt=0)  # slo: the latency objective admission control keeps
    wait_quota_ms: float = Field(60.0, gt=0)  # slo: the longest a request waits for its batch to fill

    @model_validator(mode="after")
    def _quota_within_slo(self) -> BatchingConfig:
        if self.wait_quota_ms >= self.slo_ms:
            raise ValueError(
                f"wait_quota_ms ({self.wait_quota_ms:g}) must be below slo_ms ({self.slo_ms:g}): a request "
                "also needs time to decode"
            )
        return self

    def schedule_config(self) -> ScheduleConfig:
        return ScheduleConfig(self.token_budget, self.slo_ms / 1e3, self.wait_quota_ms / self.slo_ms)


class ResourceLimits(_Strict):
    """What one request may ask of a replica, checked before it is queued (422 naming the limit).

    A beam of 10^6 once held a replica for minutes and took gigabytes; these bound a request's work
    so the largest allowed one still decodes in about a second on the tiny CPU model."""

    max_beam_width: int = Field(512, ge=1)  # beam_width and draft_beams
    max_history_items: int = Field(4096, ge=1)  # items in a request's history, before truncation
    max_batch_tokens: int = Field(1 << 20, ge=1)  # beams x prompt tokens of one decoder call


class ServeConfig(_Strict):
    model: Path
    data: Path | None = None  # None: the dataset recorded in the checkpoint
    # AtSpeed's draft model (a checkpoint on the model's codec), loaded by every replica beside the
    # model; the atspeed_* decoders may only be served with one
    draft: Path | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    decoders: list[str] = Field(default_factory=lambda: ["beam", "static"])
    defaults: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"beam": {"beam_width": 20, "k": 10}, "static": {"beam_width": 20, "k": 10}}
    )
    # sets requests name with `constraint`, built at start for every served decoder that takes one
    constraint_sets: dict[str, ConstraintSetSpec] = Field(
        default_factory=lambda: {
            "all": ConstraintSetSpec(rule="all"),
            "cold_start": ConstraintSetSpec(rule="cold_start"),
        }
    )
    history_policy: Literal["truncate", "reject"] = "truncate"  # over-long histories
    max_k: int = Field(100, ge=1)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    threads: int = Field(1, ge=1)  # torch threads per replica (= its CPUs)
    num_cpus: float | None = None  # Ray CPUs per replica; None: `threads`
    num_gpus: float | Literal["auto"] = "auto"  # auto: one GPU per replica when the cluster has GPUs
    num_replicas: int = Field(1, ge=1)
    autoscaling: dict[str, Any] | None = None  # Serve autoscaling_config; replaces num_replicas
    max_ongoing_requests: int | None = None  # Serve's per-replica admission; None: above the app's own bound
    max_queued_requests: int = Field(64, ge=1)  # per replica, requests waiting beyond one batch: then 503
    overload_status: Literal[503, 429] = 503
    retry_after_s: float = Field(1.0, ge=0)
    request_timeout_s: float = Field(10.0, gt=0)  # the app answers 504 after this
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    # A client must send its whole body within this (the app answers 408; HAProxy's `timeout
    # http-request` is set to it too), so connections that stall mid-body cannot pin a replica.
    body_timeout_s: float = Field(5.0, gt=0, le=600)
    # HAProxy's `timeout client`: an idle client connection is closed after this (Ray's default is an
    # hour, which let a few hundred idle connections starve the ingress)
    client_timeout_s: float = Field(30.0, gt=0, le=3600)
    warmup_batches: int = Field(2, ge=0)
    # The replica's threads (Serve's event loops, the decoder) share the GIL; Python's default 5 ms
    # switch interval lets a busy thread delay a request's hand-offs by that much each time.
    gil_switch_interval_s: float | None = Field(0.0005, gt=0)
    # Decode in the replica's decoder thread, so /health, timeouts and cancellation keep working while a
    # batch decodes (False: on the event loop, a little faster on a 2-core machine, but one long
    # decode then blocks every other request; see docs/serving.md)
    decode_in_thread: bool = True
    # POST /rank: a ranking checkpoint folder (`genrec rank train --out DIR`); None: /rank answers 404
    ranking: Path | None = None
    ranking_max_candidates: int = Field(10000, ge=1)  # B per /rank request

    @model_validator(mode="after")
    def _consistent(self) -> ServeConfig:
        extra = sorted(set(self.defaults) - set(self.decoders))
        if extra:
            raise ValueError(f"defaults for {extra}, which are not in decoders {self.decoders}")
        drafted = [d for d in self.decoders if needs_draft(d)]
        if drafted and self.draft is None:  # a replica would start and then fail every such request
            fix = "set `draft: DIR` in the config or pass --draft DIR"
            raise ValueError(draft_needed_message(drafted[0], fix))
        return self

    def resolved(self, base: Path | None = None) -> ServeConfig:
        """A copy with absolute paths (replicas may start in another working directory)."""
        base = base or Path.cwd()

        def absolute(p: Path | None) -> Path | None:
            if p is None:
                return None
            p = p.expanduser()
            return (p if p.is_absolute() else base / p).resolve()

        return self.model_copy(
            update={
                "model": absolute(self.model),
                "data": absolute(self.data),
                "draft": absolute(self.draft),
                "ranking": absolute(self.ranking),
            }
        )


def resolve_hf_models(
    args: dict[str, Any], data: str | None = None, how: str = "args.{key}"
) -> dict[str, Any]:
    """`args` with `model` / `draft` given as hf:DIR replaced by the cached import's folder (the items'
    SIDs from `data`, else args' `data`; workloads/models/hf_cache.py). `genrec serve` and a config
    deployed with Ray's own `serve deploy` (build_app) both take this path."""
    from genrec.workloads.models.hf_cache import is_hf_spec, resolve_model

    data = data or args.get("data")
    out = dict(args)
    for key in ("model", "draft"):
        if is_hf_spec(out.get(key)):
            out[key] = str(resolve_model(out[key], data, role=how.format(key=key)))
    return out


def parse_serve_config(args: dict[str, Any], where: str = "serve config") -> ServeConfig:
    """Validate the app's arguments, decoder defaults included, before Ray or a replica starts."""
    try:
        cfg = ServeConfig.model_validate(args)
    except ValidationError as e:
        raise UserInputError(f"{where}: {format_validation_error(e, ServeConfig, 'settings')}") from None
    try:
        check_decoder_defaults(cfg)
    except UserInputError as e:
        raise UserInputError(f"{where}: {e}") from None
    return cfg


def check_decoder_defaults(cfg: ServeConfig) -> None:
    """Served decoders exist and their `defaults` pass the adapter that checks every request."""
    from genrec.platform.params import parse_decoder_params
    from genrec.workloads.decoding.base import decoder_names

    unknown = [d for d in cfg.decoders if d not in decoder_names()]
    if not cfg.decoders or unknown:
        raise UserInputError(f"`decoders`: {unknown or '[]'}: choose one or more of {decoder_names()}")
    for name in cfg.decoders:
        try:
            parse_decoder_params(name, cfg.defaults.get(name, {}))
        except UserInputError as e:
            raise UserInputError(f"`defaults.{name}`: {e}") from None


def check_model_dir(cfg: ServeConfig) -> None:
    if not (cfg.model / "config.json").is_file():
        raise UserInputError(
            f"model {cfg.model}: no checkpoint there (config.json missing); train one with "
            "`genrec train --data DIR --out DIR` or pass --model pointing at a checkpoint folder"
        )
    if cfg.data is not None and not (cfg.data / "manifest.json").is_file():
        raise UserInputError(f"data {cfg.data}: not a dataset folder (manifest.json missing)")
    if cfg.draft is not None:  # config.json only, before Ray starts; each replica loads the weights
        check_same_codec(
            cfg.draft,
            checkpoint_codebook_sizes(cfg.draft),
            cfg.model,
            checkpoint_codebook_sizes(cfg.model, role="model"),
        )
    if cfg.ranking is not None:
        from genrec.workloads.ranking.checkpoint import read_ranking_config

        try:
            read_ranking_config(cfg.ranking)  # config.json only; the replicas load the weights
        except UserInputError as e:
            raise UserInputError(f"ranking: {e}") from None


class ServeFile(_Strict):
    """What `genrec serve --config` reads from a Serve config file."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    request_timeout_s: float | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    user_config: dict[str, Any] | None = None


def read_serve_file(path: Path) -> ServeFile:
    """Read a Serve config file (validated with Ray's own schema) and pick out our application."""
    if not path.is_file():
        raise UserInputError(f"serve config {path}: no such file (see serve.yaml in the repo for an example)")
    from genrec.platform.yaml_limits import load_bounded_yaml

    try:
        raw = load_bounded_yaml(path, "serve config") or {}
    except UserInputError as e:
        raise UserInputError(f"serve config {e}") from None
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(raw)
    except Exception as e:  # pydantic v1 or v2 error depending on Ray's bundled pydantic
        raise UserInputError(f"serve config {path}: not a valid Ray Serve config: {e}") from None
    apps = [a for a in raw.get("applications", []) if a.get("import_path") == APP_IMPORT_PATH]
    if len(apps) != 1:
        raise UserInputError(
            f"serve config {path}: expected exactly one application with import_path {APP_IMPORT_PATH}, "
            f"found {len(apps)}"
        )
    http = raw.get("http_options") or {}
    user_config = None
    for dep in apps[0].get("deployments") or []:
        if dep.get("name") == DEPLOYMENT_NAME and dep.get("user_config") is not None:
            user_config = dep["user_config"]
    return ServeFile(
        host=http.get("host", DEFAULT_HOST),
        port=int(http.get("port", DEFAULT_PORT)),
        request_timeout_s=http.get("request_timeout_s"),
        args=apps[0].get("args") or {},
        user_config=user_config,
    )
