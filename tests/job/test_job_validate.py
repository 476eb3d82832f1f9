"""One home for a job's checks (job/validate.py): run, plan and batch prepare refuse the same bad
options, with the same message, before any work (here: before the model is even looked for)."""

from __future__ import annotations

import pytest
from helpers.rows import texts, write_jsonl

from bulkrun.exceptions import UsageError
from bulkrun.job.batch_export import export_batch
from bulkrun.job.plan import plan_job
from bulkrun.job.runner import run_job
from bulkrun.job.spec import build_spec

NO_MODEL = "/nonexistent/model"  # a check that ran after model resolution would fail differently


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"task": "eval", "labels": ["a", "b"], "json_schema": "SCHEMA"}, "constraints apply to generate"),
        ({"keep_fields": ["nope"]}, "nope"),
        ({"text_field": "body"}, "body"),
    ],
)
def test_run_plan_and_export_refuse_the_same_options_before_any_work(tmp_path, values, needle):
    source = write_jsonl(tmp_path / "in.jsonl", texts(3))
    if values.get("json_schema") == "SCHEMA":
        (tmp_path / "schema.json").write_text('{"type": "string"}')
        values = values | {"json_schema": str(tmp_path / "schema.json")}
    spec = build_spec(
        [("test", {"input": str(source), "out": str(tmp_path / "out"), "model": NO_MODEL} | values)]
    )
    messages = []
    for command in (run_job, plan_job, lambda s: export_batch(s, "openai", "m-1")):
        with pytest.raises(UsageError, match=needle) as info:
            command(spec)
        messages.append(str(info.value))
    assert len(set(messages)) == 1
    assert not (tmp_path / "out").exists()


def test_a_bad_value_stops_the_spec_being_built():
    with pytest.raises(UsageError, match="window must be >= 1"):
        build_spec([("test", {"input": "x.jsonl", "window": 0})])
