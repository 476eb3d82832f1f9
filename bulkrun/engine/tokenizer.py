"""The model's tokenizer, loaded without transformers' tokenizer classes where that gives the same answers.

Importing transformers' tokenizer machinery and AutoTokenizer.from_pretrained cost a CPU run more
than its model load. Where the tokenizer is the generic tokenizer.json one (tokenizer_config names
the generic class and sets nothing a specific class would act on: BOS/EOS insertion, prefix spaces,
legacy SentencePiece handling), FastTokenizer wraps the `tokenizers` library directly and renders
chat templates with transformers' own renderer (a light module), so prompts and ids are those
AutoTokenizer gives. Any other tokenizer loads through AutoTokenizer, as before.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
# tokenizer_config keys the generic class reads the same way we do; any other key means AutoTokenizer
_UNDERSTOOD_KEYS = {
    "backend", "tokenizer_class", "bos_token", "eos_token", "unk_token", "pad_token", "model_max_length",
    "is_local", "local_files_only", "added_tokens_decoder", "chat_template", "clean_up_tokenization_spaces",
    "extra_special_tokens", "additional_special_tokens", "model_input_names", "padding_side", "truncation_side",
}  # fmt: skip
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# BERT's WordPiece tokenizers (embedding models): their tokenizer.json holds the whole pipeline; the
# config's own settings must agree with its BertNormalizer (checked in _bert_agrees)
_BERT_CLASSES = {"BertTokenizer", "BertTokenizerFast"}
_BERT_KEYS = {"do_lower_case", "sep_token", "cls_token", "mask_token", "tokenize_chinese_chars", "strip_accents",
              "name_or_path", "do_basic_tokenize", "never_split", "special_tokens_map_file"}  # fmt: skip


def load_tokenizer(model_dir: str | Path):
    """FastTokenizer where it is equivalent, else transformers' AutoTokenizer."""
    fast = FastTokenizer.load(Path(model_dir))
    if fast is not None:
        return fast
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


class FastTokenizer:
    """The subset of a transformers tokenizer bulkrun uses, over a `tokenizers.Tokenizer`."""

    def __init__(self, backend, special_tokens: dict[str, str], chat_template: str | None):
        self._backend = backend
        self.special_tokens_map = special_tokens
        self.chat_template = chat_template
        for name in _SPECIAL_NAMES:
            token = special_tokens.get(name)
            setattr(self, name, token)
            setattr(self, f"{name}_id", None if token is None else backend.token_to_id(token))

    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` itself, under transformers' name (the grammar engine reads it)."""
        return self._backend

    @classmethod
    def load(cls, model_dir: Path) -> FastTokenizer | None:
        """The tokenizer in model_dir, or None where only transformers can load it faithfully."""
        config_path, json_path = model_dir / "tokenizer_config.json", model_dir / "tokenizer.json"
        if not (config_path.is_file() and json_path.is_file()):
            return None
        config = json.loads(config_path.read_text(encoding="utf-8"))
        bert = config.get("tokenizer_class") in _BERT_CLASSES
        if (
            config.get("tokenizer_class") not in _GENERIC_CLASSES | _BERT_CLASSES
            or not (_UNDERSTOOD_KEYS | (_BERT_KEYS if bert else set())).issuperset(config)
            or config.get("clean_up_tokenization_spaces")
            or config.get("extra_special_tokens")
            or config.get("additional_special_tokens")
        ):
            return None
        special = {}
        for name in _SPECIAL_NAMES:
            token = config.get(name)
            if isinstance(token, dict):
                token = token.get("content")
            if token is not None and not isinstance(token, str):
                return None
            if token is not None:
                special[name] = token
        template = _chat_template(model_dir, config)
        if template is False:
            return None
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(json_path))
        if bert and not _bert_agrees(config, json.loads(json_path.read_text(encoding="utf-8"))):
            return None
        added = {t.content for t in backend.get_added_tokens_decoder().values()}
        declared = {t.get("content") for t in (config.get("added_tokens_decoder") or {}).values()}
        if not declared <= added or any(backend.token_to_id(t) is None for t in special.values()):
            return None  # transformers would add tokens the file lacks
        backend.no_padding()
        backend.no_truncation()
        if template:  # the renderer's import (transformers' package) runs while the model loads
            threading.Thread(target=_import_renderer, name="chat-template-import", daemon=True).start()
        return cls(backend, special, template)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self._backend.encode(text, add_special_tokens=add_special_tokens).ids}
        encoded = self._backend.encode_batch(list(text), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encoded]}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self, ids: Sequence[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces=None
    ) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("this tokenizer does not clean up tokenization spaces")
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def apply_chat_template(
        self, conversation, add_generation_prompt: bool = False, tokenize: bool = True,
        return_dict: bool = False, continue_final_message: bool = False, **kwargs,
    ):  # fmt: skip
        """As transformers' apply_chat_template for one conversation or a batch of them."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        _normalize_chat_messages, render_jinja_template = _import_renderer()
        batched = bool(conversation) and isinstance(conversation[0], list | tuple)
        conversations = [_normalize_chat_messages(c) for c in (conversation if batched else [conversation])]
        rendered, _ = render_jinja_template(
            conversations=conversations, chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            **{**self.special_tokens_map, **kwargs},
        )  # fmt: skip
        texts = rendered if batched else rendered[0]
        if not tokenize:
            return texts
        ids = self(texts, add_special_tokens=False)
        return ids if return_dict else ids["input_ids"]


def _import_renderer():
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    return _normalize_chat_messages, render_jinja_template


def _chat_template(model_dir: Path, config: dict) -> str | None | bool:
    """The template text, None where there is none, False where it is not one plain string (named
    templates: AutoTokenizer picks among them)."""
    if (model_dir / "chat_template.json").exists() or (model_dir / "additional_chat_templates").exists():
        return False
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = config.get("chat_template")
    return template if template is None or isinstance(template, str) else False


def _bert_agrees(config: dict, spec: dict) -> bool:
    """A BERT tokenizer.json that does what its config says: basic tokenization, no never-split list,
    and a BertNormalizer with the config's lowercasing, accent and Chinese-character settings."""
    norm = spec.get("normalizer") or {}
    return (
        norm.get("type") == "BertNormalizer"
        and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
        and config.get("do_basic_tokenize", True) is True
        and not config.get("never_split")
        and norm.get("lowercase") == config.get("do_lower_case", True)
        and norm.get("strip_accents") == config.get("strip_accents")
        and norm.get("handle_chinese_chars") == config.get("tokenize_chinese_chars", True)
    )
