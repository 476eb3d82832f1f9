"""A job session: the checked job (task, output directory, manifest, lock) and its final merge.

The single-process runner and the Ray driver both hold one; `finalize(report)` merges the committed
shards into the final files once every row is done and writes report.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bulkrun.io.lock import JobLock
from bulkrun.job.export import finalize as write_final_files
from bulkrun.job.report import job_figures, write_report
from bulkrun.job.spec import JobSpec
from bulkrun.tasks.base import Task


@dataclass
class JobSession:
    spec: JobSpec
    task: Task
    out: Path
    manifest: dict
    model_path: Path
    lock: JobLock

    @property
    def total_rows(self) -> int:
        return self.manifest["input"]["rows"]

    @property
    def input_format(self) -> str:
        return self.manifest["input"]["format"]

    def finalize(self, report: dict) -> dict:
        """Add the job's figures to `report`; when complete, write the final files; write report.json."""
        report = report | job_figures(self)
        if report["complete"]:
            final = write_final_files(self.out, self.manifest, self.task)
            report["files"] = final["files"]
            report["metrics"] = final["metrics"]
        write_report(self.out, report)
        return report
