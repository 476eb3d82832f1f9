"""The command-line options that spread a job: `--ray [ADDRESS]`, `--workers N`, `--shard K/N`.

The job layer puts these annotations in its shared option bundle; every job command and `bulkrun run`
gets them. Only typer is imported here (Ray is imported when a run actually uses it).
"""

from __future__ import annotations

import re
from typing import Annotated

import typer

from bulkrun.errors import UsageError
from bulkrun.io.outdir import is_uri
from bulkrun.job.slices import parse_shard

# A bare `--ray`: connect to the cluster RAY_ADDRESS or `ray start` points at, else start a local one.
RAY_DEFAULT = "default"

RayOpt = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="[ADDRESS]",
        help=(
            "Run on Ray: one engine per worker (one GPU each where there are GPUs). A bare --ray joins "
            "the running cluster (RAY_ADDRESS or `ray start`) or starts a local one; ADDRESS may be "
            "'auto', 'local', host:port or ray://host:10001. Needs: pip install 'bulkrun[ray]'."
        ),
        show_default=False,
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="With --ray: number of workers (engines). Default: one per GPU of the cluster, else 1.",
        show_default=False,
    ),
]
ShardOpt = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="K/N",
        help=(
            "Job arrays: process only slice K of N (0-based: 0/N .. N-1/N; rows whose index % N == K). "
            "All slices share one --out; `bulkrun export OUT` merges them once all are done."
        ),
        show_default=False,
    ),
]

_HOST_PORT = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def looks_like_ray_address(token: str) -> bool:
    """Whether the word after `--ray` is its address (rather than the input file or another option)."""
    return token in ("auto", "local", RAY_DEFAULT) or is_uri(token) or bool(_HOST_PORT.match(token))


def fix_bare_ray_flag(argv: list[str]) -> list[str]:
    """Give a bare `--ray` its default value, since typer options cannot have an optional value.

    `--ray` followed by an address keeps it (`--ray ray://head:10001`, `--ray auto`); followed by
    anything else (an input file, another option, nothing) it becomes `--ray=default`.
    """
    fixed: list[str] = []
    for position, token in enumerate(argv):
        if token == "--":
            fixed.extend(argv[position:])
            break
        following = argv[position + 1] if position + 1 < len(argv) else None
        if token == "--ray" and (following is None or not looks_like_ray_address(following)):
            fixed.append(f"--ray={RAY_DEFAULT}")
        else:
            fixed.append(token)
    return fixed


def check_exec_options(ray: str | bool | None, workers: int | None, shard: str | None) -> None:
    """Reject conflicting ways of spreading a job, before any work (UsageError: exit code 2)."""
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
