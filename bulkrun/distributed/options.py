"""The checks behind the options that spread a job: `--ray`, `--ray-address ADDRESS`, `--workers N`,
`--shard K/N`.

The CLI declares the options (bulkrun/cli/options.py); what they mean and which
combinations are refused lives here. Ray itself is imported only when a run actually uses it.
"""

from __future__ import annotations

import re

from bulkrun.exceptions import UsageError
from bulkrun.io.outdir import is_uri
from bulkrun.job.slices import parse_shard

# `--ray` without `--ray-address`: connect to the cluster RAY_ADDRESS or `ray start` points at, else
# start a local one.
RAY_DEFAULT = "default"

_HOST_PORT = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def looks_like_ray_address(token: str) -> bool:
    """Whether a `--ray-address` (or spec `ray`) value is a Ray address."""
    return token in ("auto", "local", RAY_DEFAULT) or is_uri(token) or bool(_HOST_PORT.match(token))


def check_ray_address(value: str | bool | None) -> None:
    """A `--ray-address` (or spec `ray`) value must be an address: refused here rather than dialled."""
    if isinstance(value, str) and not looks_like_ray_address(value):
        raise UsageError(f"{value!r} is not a Ray address (auto, local, host:port or ray://host:10001)")


def check_exec_options(ray: str | bool | None, workers: int | None, shard: str | None) -> None:
    """Reject conflicting ways of spreading a job, before any work (UsageError: exit code 2)."""
    check_ray_address(ray)
    if ray is not None and ray is not False and shard:
        raise UsageError("--ray and --shard cannot be combined: Ray splits the job itself (use --workers N)")
    if workers is not None and (ray is None or ray is False):
        raise UsageError("--workers applies to Ray runs only: add --ray (or use --shard K/N for job arrays)")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if shard:
        parse_shard(shard)


def ray_address(value: str | bool | None) -> str | None:
    """The spec's `ray` value as an address for ray.init: True/'default' -> None (Ray's own choice)."""
    if value is None or value is False:
        return None
    if value is True or value == RAY_DEFAULT or value == "":
        return None
    return str(value)
