"""`bulkrun eval`: score a suite whose rows carry expected answers; optionally sweep combinations."""

from __future__ import annotations

from pathlib import Path

import typer

from bulkrun.cli.app import app
from bulkrun.cli.classify import ANSWER_PREFIX, INSTRUCTION, LABELS, LABELS_FILE, NORMALIZE, classify_options
from bulkrun.cli.execute import run_task_command
from bulkrun.cli.jobs import INPUT
from bulkrun.cli.options import CALIBRATE_OPTIONS, JOB_OPTIONS, MULTIPLE_CHOICE_OPTIONS, with_options


def _opt(*decls: str, help: str):
    return typer.Option(None, *decls, help=help, show_default=False)


@app.command(name="eval")
@with_options(JOB_OPTIONS, CALIBRATE_OPTIONS, MULTIPLE_CHOICE_OPTIONS)
def eval_(
    input: Path = INPUT,
    expected_field: str = _opt(
        "--expected-field", help="Field with the expected answer (default: label with --labels, else answer)."
    ),
    answer_regex: str = _opt(
        "--answer-regex", help="Generation suites: the answer is this regex's first group (or whole match)."
    ),
    match: str = _opt("--match", help="Generation suites: exact (default) or normalized (whitespace, case)."),
    labels: str = LABELS,
    labels_file: Path = LABELS_FILE,
    instruction: str = INSTRUCTION,
    normalize: str = NORMALIZE,
    answer_prefix: str = ANSWER_PREFIX,
    sweep_model: list[str] = _opt("--sweep-model", help="Sweep: a model per run (repeatable, or a,b)."),
    sweep_template: list[str] = _opt(
        "--sweep-template", help="Sweep: a prompt template per run (repeatable; @file reads a file)."
    ),
    sweep_temperature: list[str] = _opt(
        "--sweep-temperature", help="Sweep: a temperature per run (repeatable, or 0,0.7)."
    ),
    opts: dict = None,
) -> int:
    """Evaluate a suite whose rows carry expected answers; metrics to OUT/metrics.json.

    Per-row correctness goes into the results; accuracy (and for --labels suites per-label
    precision/recall and a confusion matrix) into OUT/metrics.json and the end-of-job summary.

    With --labels the labels are scored (as in classify); otherwise the model generates and the
    answer is compared exactly, normalised (--match normalized), or as extracted by --answer-regex.
    Sweep options run one job per combination into OUT/runs/<name>/ and compare them in
    OUT/sweep.md and OUT/sweep.json.
    """
    options = classify_options(labels, labels_file, instruction, normalize, answer_prefix)
    options.update(expected_field=expected_field, answer_regex=answer_regex, match=match)
    options.update(
        sweep_model=_split(sweep_model), sweep_template=sweep_template or None,
        sweep_temperature=_split(sweep_temperature),
    )  # fmt: skip
    return run_task_command("eval", input, opts, options)


def _split(values: list[str] | None) -> list[str] | None:
    """Repeatable values, each of which may also be a comma list."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",")]
