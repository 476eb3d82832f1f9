"""Errors a user can cause, each with a stable process exit code.

Exit codes of every `bulkrun` command (stable; scripts and cron lines may rely on them):

====  =================  ==========================================================================
code  name               meaning
====  =================  ==========================================================================
0     OK                 every row done (or the command succeeded)
1     FATAL              an unexpected internal error (a bug: the traceback is shown)
2     USAGE              bad command line or job spec: unknown option or key, invalid value, a field
                         named by an option that the input does not have
3     ROW_ERRORS         the job finished, but some rows became error records (see OUT/errors.*)
4     INPUT              the input cannot be read: missing, unreadable, unknown or broken format
5     MODEL              the model cannot be found or loaded
6     LOCKED             another live run holds the output directory's lock
7     JOB_CHANGED        OUT holds a different job (spec, model or input changed); rerun with --restart
8     INCOMPLETE         export/status: the job (or some --shard slices) has not finished
9     OUTPUT             the output directory cannot be written (full disk, read-only, permissions)
130   INTERRUPTED        stopped by Ctrl-C / SIGTERM; committed shards are kept, rerun to resume
====  =================  ==========================================================================

`bulkrun --help` lists them from EXIT_CODES below. Library code raises these; only the CLI edge turns
them into one line on stderr and the exit code.
Bad rows are never exceptions that stop a job: they raise RowError and become error records.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
EXIT_ROW_ERRORS = 3
EXIT_INPUT = 4
EXIT_MODEL = 5
EXIT_LOCKED = 6
EXIT_JOB_CHANGED = 7
EXIT_INCOMPLETE = 8
EXIT_OUTPUT = 9
EXIT_INTERRUPTED = 130

# code -> what it means, in a few words (the table above, for `bulkrun --help`)
EXIT_CODES = {
    EXIT_OK: "every row done (or the command succeeded)",
    EXIT_FATAL: "an unexpected internal error (a bug)",
    EXIT_USAGE: "bad command line or job spec",
    EXIT_ROW_ERRORS: "finished, some rows became error records",
    EXIT_INPUT: "the input cannot be read",
    EXIT_MODEL: "the model cannot be found or loaded",
    EXIT_LOCKED: "another live run holds OUT's lock",
    EXIT_JOB_CHANGED: "OUT holds a different job (rerun with --restart)",
    EXIT_INCOMPLETE: "rows (or --shard slices) remain",
    EXIT_OUTPUT: "OUT cannot be written",
    EXIT_INTERRUPTED: "interrupted; rerun to resume",
}


class BulkrunError(Exception):
    """A failure the user can fix; the message is one line, shown without a traceback."""

    exit_code = EXIT_FATAL


class UsageError(BulkrunError):
    """Unknown option or spec key, invalid value, conflicting flags."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """An invalid TOML job spec (unknown key, wrong type, unparsable file)."""


class InputError(BulkrunError):
    """The input as a whole cannot be read (not a bad row: those become error records)."""

    exit_code = EXIT_INPUT


class ModelError(BulkrunError):
    exit_code = EXIT_MODEL


class LockHeld(BulkrunError):
    exit_code = EXIT_LOCKED


class JobChanged(BulkrunError):
    exit_code = EXIT_JOB_CHANGED


class Incomplete(BulkrunError):
    exit_code = EXIT_INCOMPLETE


class OutputError(BulkrunError):
    exit_code = EXIT_OUTPUT


class RowError(Exception):
    """A row that cannot be processed; becomes an error record (row, id, kind, message), and the
    job goes on. Raised by readers (malformed JSON), tasks (a missing field) and the job layer."""

    def __init__(self, kind: str, message: str, item_id: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.item_id = item_id  # the row's id when it is known although the row is bad
