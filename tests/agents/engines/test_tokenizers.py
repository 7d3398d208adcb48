"""The router tokenizes a prompt as the engine does, by the tokenizer its backend names for it
(agents/engines/backends.py): a real engine's from the directory it reports, a Hugging Face
`tokenizer.json` and the chat template of `tokenizer_config.json`; a simulator's its own."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from agents.engines.backends import SimTokenizer
from agents.engines.backends import tokenizer as load
from agents.engines.tokenizers import HfTokenizer

VOCAB = ["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "hello", "there", "world", "\n"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _directory(tmp_path: Path, template: object) -> Path:
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.add_special_tokens(["<s>", "</s>", "<|user|>", "<|assistant|>"])
    words.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": template, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_chat_is_rendered_with_the_engines_template_and_tokenized_with_its_vocabulary(
    tmp_path: Path,
) -> None:
    tokenizer = load(str(_directory(tmp_path, TEMPLATE)), "0.4.6")
    assert isinstance(tokenizer, HfTokenizer)
    ids = tokenizer.chat([{"role": "user", "content": "hello there"}])
    ask = {w: i for i, w in enumerate(VOCAB)}
    assert ids == [ask["<s>"], ask["<|user|>"], ask["hello"], ask["there"], ask["<|assistant|>"]]
    assert tokenizer.text("hello world") == [ask["hello"], ask["world"]]
    assert tokenizer.text("hello planet") == [ask["hello"], ask["[UNK]"]]


def test_a_named_template_list_uses_the_default_one(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "{{ 'world' }}"},
             {"name": "default", "template": TEMPLATE}]  # fmt: skip
    tokenizer = load(str(_directory(tmp_path, named)), "0.4.6")
    assert tokenizer is not None
    assert len(tokenizer.chat([{"role": "user", "content": "hello"}])) == 4


def test_without_a_tokenizer_the_router_matches_approximately(tmp_path: Path) -> None:
    assert load(str(tmp_path), "0.4.6") is None
    assert load(None, "0.4.6") is None
    assert isinstance(load(None, "0.4.6-meridian-sim"), SimTokenizer)
