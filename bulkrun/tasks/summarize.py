"""Summarize an archive: each row's text, behind an instruction, summarized in a few sentences.

The instruction comes first so that it is a prefix shared by every item (the prefix cache computes
it once). --prompt-template replaces the whole prompt; --instruction only the instruction.
"""

from __future__ import annotations

from bulkrun.tasks.base import Item, prompt_text
from bulkrun.tasks.generate import GenerateTask

DEFAULT_INSTRUCTION = "Summarize the following text in two or three sentences. Keep names and numbers exact."


class SummarizeTask(GenerateTask):
    name = "summarize"
    options = {"instruction": None}
    default_overrides = {"max_tokens": 160}

    def __init__(self, instruction: str | None = None):
        self.instruction = instruction or DEFAULT_INSTRUCTION

    def render(self, item: Item) -> str:
        text = prompt_text(item.fields, self.ctx.prompt_template, self.ctx.text_field)
        if self.ctx.prompt_template is not None:
            return text
        return f"{self.instruction}\n\n{text}"
