"""`bulkrun classify`: label every row by scoring each label as a continuation of its prompt."""

from __future__ import annotations

from pathlib import Path

import typer

from bulkrun.cli.app import app
from bulkrun.cli.execute import run_task_command
from bulkrun.cli.jobs import INPUT
from bulkrun.cli.options import CALIBRATE_OPTIONS, JOB_OPTIONS, with_options

LABELS = typer.Option(
    None,
    "--labels",
    "-l",
    help="Labels: a comma list (billing,bug,feature) or a file with one label per line, "
    "optionally 'label: description'.",
    show_default=False,
)
LABELS_FILE = typer.Option(
    None,
    "--labels-file",
    help="File with one label per line ('label: description' allowed).",
    show_default=False,
)
INSTRUCTION = typer.Option(
    None, "--instruction", help="First line of the instruction placed before every item.", show_default=False
)
NORMALIZE = typer.Option(
    None,
    "--normalize",
    help="A label's score: sum of its token log-probabilities (sum, default) or their mean (mean).",
    show_default=False,
)
ANSWER_PREFIX = typer.Option(
    None,
    "--answer-prefix",
    help="Text that begins the answer before the label is scored (default 'Label:'; '' for none).",
    show_default=False,
)


def classify_options(labels, labels_file, instruction, normalize, answer_prefix) -> dict:
    return {
        "labels": labels,
        "labels_file": None if labels_file is None else str(labels_file),
        "instruction": instruction,
        "normalize": normalize,
        "answer_prefix": answer_prefix,
    }


@app.command()
@with_options(JOB_OPTIONS, CALIBRATE_OPTIONS)
def classify(
    input: Path = INPUT,
    labels: str = LABELS,
    labels_file: Path = LABELS_FILE,
    instruction: str = INSTRUCTION,
    normalize: str = NORMALIZE,
    answer_prefix: str = ANSWER_PREFIX,
    opts: dict = None,
) -> int:
    """Classify every row: each label is scored under the row's prompt (no text is generated).

    Output per row: label, probability (a softmax over the label scores), label_probs and
    label_scores. The instruction (labels, descriptions, examples from a job spec) comes first in
    every prompt, so the prefix cache computes it once. Example:
    bulkrun classify tickets.parquet --labels billing,bug,feature --out runs/tickets
    """
    options = classify_options(labels, labels_file, instruction, normalize, answer_prefix)
    return run_task_command("classify", input, opts, options)
