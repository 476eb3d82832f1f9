"""lm-evaluation-harness's multiple-choice log-likelihoods, computed independently with plain
transformers: the reference the multiple-choice tests compare bulkrun against.

Written from lm-evaluation-harness's HFLM (`_encode_pair`, `_loglikelihood_tokens`) without using
bulkrun's code: the context's trailing whitespace joins the continuation, the continuation ids are
tokenize(context + continuation) after len(tokenize(context)) ids, an empty context is the prefix
token (BOS, else EOS), and one forward pass over (context + continuation)[:-1] gives the
continuation tokens' log-probabilities.
"""

from __future__ import annotations

import torch

# Rows of every kind: varying choice counts, multi-token choices, answers as index, text or digit
# string, a context ending in a space, an empty context, and two bad rows (an answer index out of
# range, no choices).
ROWS = [
    {
        "question": "Question: What is the capital of France?\nAnswer:",
        "choices": ["Paris", "Berlin"],
        "answer": 0,
    },
    {
        "question": "The chef put the cake in the oven and",
        "choices": [
            "waited for it to bake.",
            "threw the oven out of the window.",
            "sang.",
            "it rained fish.",
        ],
        "answer": "waited for it to bake.",
    },
    {
        "question": "Question: Which of these is a prime number?\nAnswer: ",  # trailing space moves
        "choices": ["4", "9", "11", "15", "21"],
        "answer": "2",
    },
    {"question": "", "choices": ["the", "zyzzyva quixotic"], "answer": 1},  # the prefix token alone
    {"question": "Paris is in", "choices": ["France"], "answer": 0},
    {"question": "Two plus two is", "choices": ["four", "five"], "answer": 2},  # out of range
    {"question": "Pick one", "choices": [], "answer": 0},  # no choices
]


def lm_eval_encode(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    if context == "":
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return [prefix], encode(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids) :]


@torch.no_grad()
def hf_loglikelihood(model, context_ids: list[int], continuation_ids: list[int]) -> float:
    """Sum of the continuation tokens' log-probabilities after the context (fp32 model)."""
    sequence = torch.tensor([(context_ids + continuation_ids)[:-1]])
    logprobs = torch.log_softmax(model(sequence).logits[0].float(), dim=-1)
    n = len(continuation_ids)
    positions = torch.arange(sequence.shape[1] - n, sequence.shape[1])
    return logprobs[positions, torch.tensor(continuation_ids)].sum().item()


def hf_choice_loglikelihoods(
    model, tokenizer, context: str, choices, target_delimiter: str = " "
) -> list[float]:
    """Per choice, lm-evaluation-harness's loglikelihood of `target_delimiter + choice` after `context`."""
    result = []
    for choice in choices:
        context_ids, continuation_ids = lm_eval_encode(tokenizer, context, f"{target_delimiter}{choice}")
        result.append(hf_loglikelihood(model, context_ids, continuation_ids))
    return result


def lm_eval_acc(loglikelihoods, choices, gold: int) -> tuple[bool, bool]:
    """(acc, acc_norm) of one row as lm-evaluation-harness's process_results computes them."""
    import numpy as np

    lls = np.array(loglikelihoods)
    lengths = np.array([float(len(c)) for c in choices])
    return bool(np.argmax(lls) == gold), bool(np.argmax(lls / lengths) == gold)
