"""`bulkrun export-batch` and `bulkrun import-batch`: a job through a provider's batch tier and back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bulkrun.cli.app import app
from bulkrun.cli.job_source import SOURCE, SOURCE_OPTIONS, job_spec
from bulkrun.cli.options import JOB_OPTIONS, options
from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_OK, EXIT_ROW_ERRORS


@app.command("export-batch")
@SOURCE
@options(SOURCE_OPTIONS, JOB_OPTIONS)
@click.option(
    "--provider", required=True, type=click.Choice(["openai", "anthropic"]), help="openai or anthropic."
)
@click.option("--provider-model", required=True, help="The provider's model name written into every request.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT/batch.")
def export_batch(source: Path, provider: str, provider_model: str, overwrite: bool, opts: dict) -> int:
    """Write the job's requests as provider batch files in OUT/batch/ (OpenAI Batch JSONL or Anthropic
    Message Batches requests), split at the provider's limits; bad rows become the job's error records.

    Upload the files, then bring the results back with `bulkrun import-batch OUT RESULT_FILE...`.
    """
    from bulkrun.job.batch_export import export_batch as export

    report = export(job_spec(source, opts), provider, provider_model, overwrite=overwrite)
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
@click.argument("out", type=click.Path(path_type=Path), metavar="OUT")
@click.argument(
    "result_files", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="RESULT_FILE..."
)
@click.option(
    "--export", "export_dir", type=click.Path(path_type=Path), help="The batch export (default: OUT/batch)."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON.")
def import_batch(out: Path, result_files: tuple[Path, ...], export_dir: Path | None, as_json: bool) -> int:
    """Commit a provider's batch results as shards of the job in OUT: `status`, `export` and a resumed
    run treat them as a local run's. Importing a file twice adds nothing; expired or canceled requests
    stay undone, and a plain rerun of the job finishes them locally.

    Exit code 0 when every row is done, 3 done with row errors, 8 while rows remain.
    """
    from bulkrun.job.batch_import import import_batch as import_results

    report = import_results(out, list(result_files), export_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2))
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
