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


def hf_masked_greedy(model, grammar_cache, spec: ConstraintSpec, prompt_ids: list[int], eos_token_id: int,
                     max_tokens: int) -> list[int]:  # fmt: skip
    """transformers' greedy continuation under the grammar's mask (the model's own KV cache, one
    row): the tokens an engine's constrained greedy row must give, up to EOS (not included, as the
    engine reports them)."""
    import torch

    from bulkrun.engine.structured_output.bitmask import apply_token_bitmask
    from bulkrun.engine.structured_output.grammar import MaskFiller, new_bitmask

    matcher, filler = grammar_cache.matcher(spec), MaskFiller()
    bitmask = new_bitmask(1, grammar_cache.tokenizer)
    cache, step, out = {}, torch.tensor([list(prompt_ids)]), []
    with torch.no_grad():
        while len(out) < max_tokens:
            result = model(input_ids=step, use_cache=True, **cache)
            key = "cache" if "cache" in result else "past_key_values"  # transformers 5 / 4.x
            cache, logits = {key: result[key]}, result.logits[0, -1:].float()
            filler.fill([matcher], bitmask)
            apply_token_bitmask(logits, torch.from_numpy(bitmask))
            token = int(logits.argmax(-1))
            if token == eos_token_id:
                break
            assert matcher.accept(token), matcher.error
            out.append(token)
            step = torch.tensor([[token]])
    return out
