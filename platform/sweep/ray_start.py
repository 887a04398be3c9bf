"""The Ray instance a sweep runs on and what each trial asks of it.

Which Ray (`resolve_ray_address`: --ray-address, the experiment's ray.address, RAY_ADDRESS, else a new
local instance), starting or joining it (`init_ray`), the per-trial CPU / GPU (`TrialResources`, with
`resources.gpu: auto` resolved by `trial_gpu`), the refusal of a trial that can never fit a local
instance (`check_trial_resources`, shared with `genrec sweep --dry-run`, which sizes the instance it
would start with `local_cluster`), and how many trials run side by side (`concurrent_slots`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import ray

from genrec.platform.experiment import ExperimentConfig
from genrec.platform.ray_options import local_ray_options, on_loopback
from genrec.platform.sweep.interrupt import take_back
from genrec.workloads.errors import UserInputError

AUTO_GPU_FRACTION = 0.25  # resources.gpu: auto -> this share of a GPU per trial when GPUs exist
_started_here = False  # init_ray started or joined Ray (not a caller that had it up already)


@dataclass(frozen=True)
class TrialResources:
    """What one trial asks Ray for, beside what the cluster had when the sweep started."""

    cpu: float
    gpu: float
    cluster_cpu: float
    cluster_gpu: float


def resolve_ray_address(cfg: ExperimentConfig, override: str | None = None) -> str:
    """--ray-address, then the experiment's ray.address, then RAY_ADDRESS, else a new local instance
    (never silently joining some other local cluster found in /tmp/ray)."""
    return override or cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"


def local_cluster(cfg: ExperimentConfig) -> tuple[float, float]:
    """(CPUs, GPUs) a new local Ray instance of this experiment gets: `ray.num_cpus` or the machine's
    CPU count, and the GPUs torch sees. For `--dry-run`, which starts no Ray."""
    cpus = cfg.ray.num_cpus or os.cpu_count() or 1
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return float(cpus), float(gpus)


def trial_gpu(requested: float | str, cluster_gpu: float) -> float:
    """resources.gpu as a number: `auto` is a share of a GPU when the cluster has any, else none."""
    if requested == "auto":  # GPUs up when the sweep starts (an autoscaling cluster: set resources.gpu)
        return AUTO_GPU_FRACTION if cluster_gpu > 0 else 0.0
    return float(requested)


def trial_resources(cfg: ExperimentConfig, cluster: dict[str, float]) -> TrialResources:
    """The experiment's per-trial resources against Ray's `cluster_resources()`."""
    cluster_cpu, cluster_gpu = cluster.get("CPU", 0), cluster.get("GPU", 0)
    gpu = trial_gpu(cfg.resources.gpu, cluster_gpu)
    return TrialResources(cfg.resources.cpu, gpu, cluster_cpu, cluster_gpu)


def trial_device(requested: str, gpu: float) -> str:
    """eval.device as a trial uses it: `auto` is cuda when the trial gets a share of a GPU."""
    return requested if requested != "auto" else ("cuda" if gpu else "cpu")


def check_trial_resources(cpu: float, gpu: float, cluster_cpu: float, cluster_gpu: float) -> None:
    """A trial that asks for more than a fixed local instance has can never run: exit 2 now. One
    source for the real run (Ray's own numbers) and `--dry-run` (`local_cluster`)."""
    if cluster_cpu < cpu or (gpu and cluster_gpu < gpu):
        raise UserInputError(
            f"`resources`: a trial asks for {cpu:g} CPU / {gpu:g} GPU but this machine's Ray has "
            f"{cluster_cpu:g} CPU / {cluster_gpu:g} GPU; lower resources.cpu or resources.gpu"
        )


def concurrent_slots(resources: TrialResources, max_concurrent: int, to_run: int) -> int:
    """How many trials the resources let run at once, capped by max_concurrent (0: no cap) and by the
    trials left to run; at least 1."""
    cpu_slots = math.floor(resources.cluster_cpu / resources.cpu + 1e-9)
    gpu_slots = math.floor(resources.cluster_gpu / resources.gpu + 1e-9) if resources.gpu else cpu_slots
    return max(1, min(cpu_slots, gpu_slots, max_concurrent or cpu_slots, to_run))


def init_ray(cfg: ExperimentConfig, address: str, progress: bool = False) -> bool:
    """Start or join Ray unless this process already did; True if this call started it."""
    global _started_here
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if progress:  # Ray's start takes seconds to tens of seconds: say what the wait is
        where = f"local, {local_cluster(cfg)[0]:g} CPUs" if address == "local" else f"joining {address}"
        print(f"starting Ray ({where})...", flush=True)
    if address == "local":
        kwargs["num_cpus"] = cfg.ray.num_cpus
        # trial output stays in Ray's logs (a failed trial's traceback is in its error.txt); the
        # driver prints one line per trial instead of workers' shutdown noise
        kwargs["log_to_driver"] = False
        kwargs["_system_config"] = {"worker_niceness": cfg.ray.worker_niceness}  # see RaySpec
        kwargs.update(local_ray_options())  # session files in a folder of this user's only
    with on_loopback(address):  # a new local instance listens on 127.0.0.1 only
        ray.init(address=address, **kwargs)
    _started_here = True
    take_back()  # SIGTERM / SIGHUP stop the sweep as Ctrl-C does, not Ray's abort
    return True


def ray_is_up() -> bool:
    return ray.is_initialized()


def shutdown_started_ray() -> None:
    """Shut down the Ray `init_ray` started (a local instance: its workers, agents and daemons; a cluster:
    this driver's connection), now rather than at exit; a Ray the caller had up already is left alone."""
    global _started_here
    if _started_here and ray.is_initialized():
        ray.shutdown()
    _started_here = False


def kill_started_ray() -> None:
    """SIGKILL what is left of a local Ray that `init_ray` started (its GCS, raylet, agents and the
    processes they started); for when a clean `ray.shutdown` cannot finish (the GCS is already gone)."""
    node = ray._private.worker._global_node
    if _started_here and node is not None and node.head:
        node.kill_all_processes(check_alive=False, allow_graceful=False)
