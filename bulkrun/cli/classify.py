"""`bulkrun classify`: label every row by scoring each label as a continuation of its prompt."""

from __future__ import annotations

from pathlib import Path

from bulkrun.cli.app import INPUT, app
from bulkrun.cli.execute import run_task_command
from bulkrun.cli.options import JOB_OPTIONS, opt, options

LABEL_OPTIONS = [
    opt("labels", str, "--labels", "-l", help="Labels: a comma list (billing,bug,feature) or a file with one label per line, optionally 'label: description'."),
    opt("labels_file", str, "--labels-file", help="File with one label per line ('label: description' allowed)."),
    opt("instruction", str, "--instruction", help="First line of the instruction placed before every item."),
    opt("normalize", str, "--normalize", help="A label's score: sum of its token log-probabilities (sum, default) or their mean (mean)."),
    opt("answer_prefix", str, "--answer-prefix", help="Text that begins the answer before the label is scored (default 'Label:'; '' for none)."),
]  # fmt: skip


@app.command()
@INPUT
@options(JOB_OPTIONS, LABEL_OPTIONS)
def classify(input: Path, opts: dict) -> int:
    """Classify every row: each label is scored under the row's prompt (no text is generated).

    Output per row: label, probability (a softmax over the label scores), label_probs and
    label_scores. The instruction (labels, descriptions, examples from a job spec) comes first in
    every prompt, so the prefix cache computes it once. Example:
    bulkrun classify tickets.parquet --labels billing,bug,feature --out runs/tickets
    """
    return run_task_command("classify", input, opts)
