"""Import Ray (an optional extra) and connect to a cluster, or start a local one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bulkrun.errors import BulkrunError, UsageError

INSTALL_HINT = (
    "--ray needs Ray, an optional extra: pip install 'bulkrun[ray]'  (or: pip install 'ray[default]')"
)


class RayUnavailable(UsageError):
    """Ray is not installed (exit code 2: the command line asked for something this install lacks)."""


class RayConnectError(BulkrunError):
    """The Ray cluster at the given address cannot be reached."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class Cluster:
    ray: Any
    started_here: bool  # we started a local cluster (and shut it down at the end)
    num_cpus: float
    num_gpus: float


def connect(address: str | None, workers: int | None) -> Cluster:
    """Join the cluster at `address` (None: RAY_ADDRESS / a `ray start` cluster, else a new local one).

    Reuses an already initialised Ray (tests, notebooks). A new local cluster gets one CPU per worker
    at least, so `--workers N` on a small machine still runs N engines.
    """
    ray = import_ray()
    started_here = False
    if not ray.is_initialized():
        started_here = _init(ray, address, workers)
    resources = ray.cluster_resources()
    return Cluster(ray, started_here, resources.get("CPU", 0.0), resources.get("GPU", 0.0))


def _init(ray: Any, address: str | None, workers: int | None) -> bool:
    quiet = {"log_to_driver": True, "include_dashboard": False, "configure_logging": False}
    if address is None:
        try:  # a cluster that `ray start` or RAY_ADDRESS points at, if there is one
            ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", **quiet)
            return False
        except ConnectionError:
            if os.environ.get("RAY_ADDRESS"):
                raise RayConnectError(
                    f"cannot reach the Ray cluster RAY_ADDRESS={os.environ['RAY_ADDRESS']}"
                ) from None
        address = "local"
    if address == "local":
        ray.init(num_cpus=max(workers or 1, os.cpu_count() or 1), **quiet)
        return True
    try:
        ray.init(address=address, **quiet)
    except ConnectionError as exc:
        raise RayConnectError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    return False
