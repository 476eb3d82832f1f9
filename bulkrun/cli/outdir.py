"""Commands on an output directory: status and export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bulkrun.cli.app import app
from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_OK, UsageError
from bulkrun.io.outdir import is_uri

# The job's output directory (its --out; a path or a URI).
OUT = click.argument("out", metavar="OUT")


@app.command()
@OUT
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(out: str, as_json: bool) -> int:
    """Show how far a job is (OUT: its --out, a path or a URI): rows done, errored and remaining,
    whether a run is alive, throughput.

    Exit code 0 when the job is finished, 8 while rows remain.
    """
    from bulkrun.job.status import job_status, status_lines

    if is_uri(out):
        from bulkrun.distributed.uri import status_at_uri

        info = status_at_uri(out)
    else:
        info = job_status(Path(out))
    click.echo(json.dumps(info, indent=2) if as_json else "\n".join(status_lines(info)))
    return EXIT_OK if info["remaining"] == 0 else EXIT_INCOMPLETE


@app.command()
@OUT
@click.option(
    "--format", "-f", "fmt", default=None, help="results as jsonl or parquet (default: like the input)."
)
@click.option("--force", is_flag=True, help="Export what is committed even if rows remain.")
def export(out: str, fmt: str | None, force: bool) -> int:
    """Merge the committed shards of OUT (its --out, a path or a URI) into the final files
    (results, errors, OpenAI output), in input order.

    For a job split with --shard K/N, run this once every slice is done; it lists the missing slices
    otherwise (exit code 8).
    """
    from bulkrun.job.export import export_job

    if fmt not in (None, "jsonl", "parquet"):
        raise UsageError(f"--format must be jsonl or parquet, got {fmt!r}")
    if is_uri(out):
        from bulkrun.distributed.uri import export_at_uri

        report = export_at_uri(out, fmt, force)
    else:
        report = export_job(Path(out), fmt, force)
    print(f"exported {report['results_total']} results and {report['errors_total']} errors: "
          + ", ".join(f"{out.rstrip('/')}/{name}" for name in report["files"]), file=sys.stderr)  # fmt: skip
    return EXIT_OK
