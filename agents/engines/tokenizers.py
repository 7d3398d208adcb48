"""The engine's own tokens for a prompt, where the router needs them exactly: matching a request
against the KV-cache events an engine publishes, which name token ids, not text.

A real engine's tokenizer is loaded from the directory it reports as its `tokenizer_path`
(its `/server_info`): a Hugging Face `tokenizer.json` and a `tokenizer_config.json` with the
chat template, rendered as the engine renders it (Jinja, sandboxed). Which tokenizer an engine
uses is its backend's to say (agents/engines/backends.py `tokenizer`): the simulator counts
tokens its own way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class PromptTokenizer(Protocol):
    def chat(self, messages: list[Any]) -> list[int]: ...
    def text(self, text: str) -> list[int]: ...


class HfTokenizer:
    """A Hugging Face tokenizer directory, as SGLang loads it."""

    def __init__(self, directory: Path) -> None:
        import jinja2.sandbox
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(template) if isinstance(template, str) else None
        self._special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}

    def chat(self, messages: list[Any]) -> list[int]:
        if self._template is None:
            text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            return self.text(text)
        text = self._template.render(messages=messages, add_generation_prompt=True, **self._special)
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)
