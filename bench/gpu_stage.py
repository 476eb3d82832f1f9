"""What a gpu_check stage's script shares: its time budget and figures kept as each phase ends.

gpu_check.sh runs every stage under a limit and passes its end as GPU_CHECK_STAGE_DEADLINE (epoch
seconds: the interpreter's start-up counts too); a phase that would not fit in what is left is
skipped and says so, instead of the stage being killed mid-phase.
After every phase the stage's JSON is rewritten, a line appended to GPU_CHECK_PROGRESS (gpu_check's
$OUT/progress.jsonl, which reaches $OUT at once) and a cumulative FIGURE line printed: a stage cut
short, even with the whole script, still leaves what it measured.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class Stage:
    def __init__(self, json_path: Path | None):
        self.json_path = json_path
        self.started = time.monotonic()
        deadline = os.environ.get("GPU_CHECK_STAGE_DEADLINE")
        self.deadline = float(deadline) if deadline else None  # None: no limit (run by hand)
        self.figures: dict = {}
        self.lines: list[str] = []
        self.ok = True

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def fits(self, phase: str, seconds: float) -> bool:
        """Whether `phase`, expected to take `seconds`, fits in what is left; if not it is recorded
        as skipped (which does not fail the stage: its correctness phases come first)."""
        if self.left() >= seconds:
            return True
        self.done(
            phase, {"skipped": f"needs ~{seconds:.0f}s, {self.left():.0f}s left"}, True, f"{phase} skipped"
        )
        return False

    def done(self, phase: str, figures: dict, ok: bool, line: str) -> None:
        self.figures[phase] = {
            **figures,
            "ok": ok,
            "seconds_into_stage": round(time.monotonic() - self.started, 1),
        }
        self.ok &= ok
        self.lines.append(line if ok else f"{line} FAILED")
        self.figures["ok"] = self.ok
        if self.json_path is not None:
            self.json_path.write_text(json.dumps(self.figures, indent=2, default=str))
        progress = os.environ.get("GPU_CHECK_PROGRESS")
        if progress:
            row = {"stage": os.environ.get("GPU_CHECK_STAGE_NUM"), "phase": phase, **self.figures[phase]}
            with open(progress, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        print(f"{phase}: {'ok' if ok else 'FAILED'}", flush=True)
        print(f"FIGURE: {'; '.join(self.lines)}", flush=True)

    def exit_code(self) -> int:
        return 0 if self.ok else 1
