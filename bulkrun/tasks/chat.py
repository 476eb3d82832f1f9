"""Chat input: a row whose `messages` column (or the --messages-field one) holds a conversation, a
list of {role, content} objects, is the prompt as it is (the chat template is applied to it, --system
prepended when the conversation has no system message of its own).

The conversation column is used when --messages-field names it, or when the row has a `messages`
column and no text field (the shape of most instruction datasets); --prompt-template wins over both.
A malformed conversation is that row's error record, naming what is wrong and where.
"""

from __future__ import annotations

from bulkrun.exceptions import RowError
from bulkrun.tasks.base import TaskContext

MESSAGES = "messages"
ROLES = ("system", "user", "assistant")


def row_messages(fields: dict, ctx: TaskContext) -> list[dict] | None:
    """The row's conversation, checked; None when the row's prompt is its text (or template)."""
    if ctx.prompt_template is not None:
        return None
    name = ctx.messages_field or MESSAGES
    if ctx.messages_field is None and (name not in fields or ctx.text_field in fields):
        return None
    if name not in fields:
        raise RowError("missing_field", f"messages field '{name}' is missing")
    return check_messages(fields[name], name)


def check_messages(value, name: str) -> list[dict]:
    """A conversation as plain dicts {role, content}; RowError("bad_messages") saying what is wrong."""
    if value is None:
        raise RowError("bad_messages", f"field '{name}' is null")
    if not isinstance(value, list | tuple):
        raise RowError(
            "bad_messages",
            f"field '{name}' must be a list of {{role, content}} messages, got {type(value).__name__}",
        )
    if not value:
        raise RowError("bad_messages", f"field '{name}' is an empty list of messages")
    out = []
    for i, message in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(message, dict):
            raise RowError(
                "bad_messages", f"{where} is a {type(message).__name__}, not a {{role, content}} object"
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise RowError("bad_messages", f"{where}.role is {role!r}; use {', '.join(ROLES)}")
        if not isinstance(content, str):
            what = "missing" if content is None else f"a {type(content).__name__}, not a string"
            raise RowError("bad_messages", f"{where}.content is {what}")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in out):
        raise RowError("bad_messages", f"field '{name}' has no user message")
    return out
