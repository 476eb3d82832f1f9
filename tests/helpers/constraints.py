"""Constraints of the end-to-end tests: schemas of every shape the issue names, a regex and a choice
list, with a prompt each that makes the default model try."""

from __future__ import annotations

from bulkrun.engine.structured_output.grammar import ConstraintSpec

NAME = {"type": "string", "minLength": 1, "maxLength": 30}
# Objects are closed (additionalProperties false): JSON Schema allows extra keys by default, and a
# small model then keeps inventing keys until max_tokens.
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "customer": {
                "type": "object",
                "properties": {
                    "name": NAME,
                    "address": {
                        "type": "object",
                        "properties": {"city": NAME},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["customer"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "score": {"type": "number", "minimum": 0, "maximum": 10},
        },
        "required": ["age", "score"],
        "additionalProperties": False,
    },
    "required_and_optional": {
        "type": "object",
        "properties": {"title": NAME, "note": NAME, "done": {"type": "boolean"}},
        "required": ["title", "done"],
        "additionalProperties": False,
    },
}
PROMPTS = {
    "nested": "Give me a customer record as JSON with a name and an address.",
    "enums": "Pick a t-shirt color and size. Answer in JSON.",
    "arrays": "List a few tags for a blog post about cooking, as JSON.",
    "numbers": "Describe a student with an age and a test score, as JSON.",
    "required_and_optional": "Write a to-do item as JSON.",
    "regex": "When is the meeting? Answer with a time like 14:30.",
    "choice": "Is the review 'Terrible, it broke after a day' positive, negative or neutral?",
}


def specs() -> dict[str, ConstraintSpec]:
    out = {name: ConstraintSpec.json_schema(schema) for name, schema in SCHEMAS.items()}
    out["regex"] = ConstraintSpec.regex(r"([01][0-9]|2[0-3]):[0-5][0-9]")
    out["choice"] = ConstraintSpec.choice(["positive", "negative", "neutral"])
    return out
