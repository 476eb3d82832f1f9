"""Import Ray (an optional extra) and connect to a cluster, or start a local one."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from bulkrun.errors import UsageError

INSTALL_HINT = (
    "--ray needs Ray, an optional extra: pip install 'bulkrun[ray]'  (or: pip install 'ray[default]')"
)


PROBE_TIMEOUT_S = 10.0  # a live head answers a TCP connect at once; this only bounds a dead one


class RayUnavailable(UsageError):
    """Ray is not installed (exit code 2: the command line asked for something this install lacks)."""


class RayConnectError(UsageError):
    """The Ray cluster at the given address cannot be reached (exit code 2: the address asked for is
    not there; a rerun once it is resumes the job)."""


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
        if os.environ.get("RAY_ADDRESS"):
            _probe(os.environ["RAY_ADDRESS"], f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}")
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
    _probe(address, f"at {address}")
    try:
        ray.init(address=address, **quiet)
    except ConnectionError as exc:
        raise RayConnectError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    return False


def _probe(address: str, named: str) -> None:
    """Fail fast where nothing listens at a host:port address: ray.init retries a dead address for
    minutes (seen: over ten), which an overnight cron job would spend hanging. Other forms go to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise RayConnectError(f"cannot reach the Ray cluster {named}: {exc}") from None
