"""`bulkrun eval`: score a suite whose rows carry expected answers; optionally sweep combinations."""

from __future__ import annotations

from pathlib import Path

from bulkrun.cli.app import INPUT, app
from bulkrun.cli.classify import LABEL_OPTIONS
from bulkrun.cli.execute import run_task_command
from bulkrun.cli.options import JOB_OPTIONS, opt, options

EVAL_OPTIONS = [
    opt("expected_field", str, "--expected-field", help="Field with the expected answer (default: label with --labels, else answer)."),
    opt("answer_regex", str, "--answer-regex", help="Generation suites: the answer is this regex's first group (or whole match)."),
    opt("match", str, "--match", help="Generation suites: exact (default) or normalized (whitespace, case)."),
]  # fmt: skip
SWEEP_OPTIONS = [
    opt("sweep_model", list[str], "--sweep-model", help="Sweep: a model per run (repeatable, or a,b)."),
    opt("sweep_template", list[str], "--sweep-template", help="Sweep: a prompt template per run (repeatable; @file reads a file)."),
    opt("sweep_temperature", list[str], "--sweep-temperature", help="Sweep: a temperature per run (repeatable, or 0,0.7)."),
]  # fmt: skip


@app.command(name="eval")
@INPUT
@options(JOB_OPTIONS, EVAL_OPTIONS, LABEL_OPTIONS, SWEEP_OPTIONS)
def eval_(input: Path, opts: dict) -> int:
    """Evaluate a suite whose rows carry expected answers; metrics to OUT/metrics.json.

    Per-row correctness goes into the results; accuracy (and for --labels suites per-label
    precision/recall and a confusion matrix) into OUT/metrics.json and the end-of-job summary.

    With --labels the labels are scored (as in classify); otherwise the model generates and the
    answer is compared exactly, normalised (--match normalized), or as extracted by --answer-regex.
    Sweep options run one job per combination into OUT/runs/<name>/ and compare them in
    OUT/sweep.md and OUT/sweep.json.
    """
    for key in ("sweep_model", "sweep_temperature"):  # repeatable, and each may be a comma list
        if key in opts:
            opts[key] = [part.strip() for value in opts[key] for part in value.split(",")]
    return run_task_command("eval", input, opts)
