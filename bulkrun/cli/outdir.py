"""Commands on an output directory: status and export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bulkrun.cli import options as opt
from bulkrun.cli.app import app
from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_OK, UsageError
from bulkrun.io.outdir import is_uri


@app.command()
def status(out: opt.OutDir, as_json: opt.AsJson = False) -> int:
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
    print(json.dumps(info, indent=2) if as_json else "\n".join(status_lines(info)))
    return EXIT_OK if info["remaining"] == 0 else EXIT_INCOMPLETE


@app.command()
def export(out: opt.OutDir, format: opt.Format = None, force: opt.Force = False) -> int:
    """Merge the committed shards of OUT (its --out, a path or a URI) into the final files
    (results, errors, OpenAI output), in input order.

    For a job split with --shard K/N, run this once every slice is done; it lists the missing slices
    otherwise (exit code 8).
    """
    from bulkrun.job.export import export_job

    if format not in (None, "jsonl", "parquet"):
        raise UsageError(f"--format must be jsonl or parquet, got {format!r}")
    if is_uri(out):
        from bulkrun.distributed.uri import export_at_uri

        report = export_at_uri(out, format, force)
    else:
        report = export_job(Path(out), format, force)
    print(f"exported {report['results_total']} results and {report['errors_total']} errors: "
          + ", ".join(f"{out.rstrip('/')}/{name}" for name in report["files"]), file=sys.stderr)  # fmt: skip
    return EXIT_OK
