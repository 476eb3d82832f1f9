"""`bulkrun export-batch` and `bulkrun import-batch`: a job through a provider's batch tier and back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from bulkrun.cli.app import app
from bulkrun.cli.job_source import SETS, SOURCE, TASK, job_spec
from bulkrun.cli.options import JOB_OPTIONS, with_options
from bulkrun.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_ROW_ERRORS


@app.command("export-batch")
@with_options(JOB_OPTIONS)
def export_batch(
    source: Path = SOURCE,
    provider: str = typer.Option(..., "--provider", help="openai or anthropic."),
    provider_model: str = typer.Option(
        ..., "--provider-model", help="The provider's model name written into every request."
    ),
    task: str = TASK,
    set_: list[str] = SETS,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier export in OUT/batch."),
    opts: dict = None,
) -> int:
    """Write the job's requests as provider batch files in OUT/batch/ (OpenAI Batch JSONL or Anthropic
    Message Batches requests), split at the provider's limits; bad rows become the job's error records.

    Upload the files, then bring the results back with `bulkrun import-batch OUT RESULT_FILE...`.
    """
    from bulkrun.job.batch_export import export_batch as export

    report = export(job_spec(source, task, set_, opts), provider, provider_model, overwrite=overwrite)
    print(
        f"exported {report['requests']} requests for {report['rows']} rows to {report['directory']} "
        f"({', '.join(report['files']) or 'no files'}); {report['error_records']} error records committed",
        file=sys.stderr,
    )
    if report["refused"] or report["local_only"]:
        print(
            f"{len(report['refused']) + report['local_only']} rows the provider cannot take are left for a "
            "local run of the job",
            file=sys.stderr,
        )
    return EXIT_OK


@app.command("import-batch")
def import_batch(
    out: Path = typer.Argument(
        ..., help="The job's output directory (where export-batch wrote).", show_default=False
    ),
    result_files: list[Path] = typer.Argument(
        ..., help="OpenAI batch output / error files or Anthropic results files.", show_default=False
    ),
    export_dir: Path = typer.Option(None, "--export", help="The batch export (default: OUT/batch)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was imported as JSON."),
) -> int:
    """Commit a provider's batch results as shards of the job in OUT: `status`, `export` and a resumed
    run treat them as a local run's. Importing a file twice adds nothing; expired or canceled requests
    stay undone, and a plain rerun of the job finishes them locally.

    Exit code 0 when every row is done, 3 done with row errors, 8 while rows remain.
    """
    from bulkrun.job.batch_import import import_batch as import_results

    report = import_results(out, result_files, export_dir)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        print(
            f"imported {report['results']} results and {report['errors']} errors into {out} "
            f"({report['already_done']} already done, {len(report['retryable'])} retryable left undone); "
            f"{report['remaining']} rows remain",
            file=sys.stderr,
        )
    if report["remaining"]:
        return EXIT_INCOMPLETE
    return EXIT_ROW_ERRORS if report.get("errors_total") else EXIT_OK
