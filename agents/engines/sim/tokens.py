"""Deterministic, cheap tokens for the simulator, counted as the model directory's tokenizer
counts them.

By default, the shipped model directory (`model/`): a word-level `tokenizer.json` whose
pre-tokenizer splits text into runs of word characters and runs of punctuation. The
simulator splits the same way, so a client that loads that tokenizer counts the same
tokens. Words the vocabulary lacks get a stable hashed id instead of `<unk>`, so that
different prompts stay different in the prefix cache.

Started with `--model-path` at another model directory (the tiny model Meridian makes for the
real SGLang, `meridian engines tiny-model`), it counts with that directory's tokenizer and
renders its chat template, as SGLang serving it does: both engines then see the same tokens
for the same prompt. Generated tokens are drawn from that vocabulary (the real tiny model's
answers are noise too).

Log-probabilities are a function of the context too (`logprob`): the greedy next token is
likely (between -0.32 and -0.02), any other unlikely (between -12 and -3), so that a
teacher-forced score of a reference continuation is high where the reference is what this
model would say. A worker with "wrong weights" shifts every log-probability down by a
deterministic amount (`shift` on average); a worker that emits garbage or repeats one token
computes wrong too.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from array import array
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2.sandbox
from tokenizers import Tokenizer

MODEL_DIR = Path(__file__).with_name("model")
VOCAB_SIZE = 128_256
_PIECES = re.compile(r"\w+|[^\w\s]+")
_SPECIAL = 6  # ids below this are special tokens; generated text uses the words after them
_WORDS = 200  # the words generated text draws on
_WINDOW = 8  # the context's tokens that choose the next one
REPEAT = 210  # "!": what a worker stuck on one token emits
GARBAGE_FROM = 0x2580  # ids with no name decode as two characters of U+2580..U+25FF


class _Directory:
    """A model directory's own tokenizer and chat template (a Hugging Face one)."""

    def __init__(self, directory: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = config.get("chat_template")
        self.template = env.from_string(template) if isinstance(template, str) else None
        self.specials = {k: str(config.get(k) or "") for k in ("bos_token", "eos_token")}
        self.size = self.tokenizer.get_vocab_size()
        special = [i for t, i in self.tokenizer.get_vocab().items() if t.startswith("<|")]
        self.first = max(special, default=-1) + 1  # generated tokens: ids after the special
        self.repeat = self.tokenizer.token_to_id("!") or self.first

    def chat(self, messages: Sequence[dict[str, Any]], continue_final: bool) -> str:
        if self.template is None:
            return "\n".join(_content(m.get("content")) for m in messages)
        rendered = [{**m, "content": _content(m.get("content"))} for m in messages]
        open_final = continue_final and bool(rendered) and rendered[-1]["role"] == "assistant"
        text: str = self.template.render(
            messages=rendered, add_generation_prompt=not open_final, **self.specials
        )
        if open_final:  # cut after the final message's content, as transformers does
            final = rendered[-1]["content"]
            at = text.rfind(final)
            text = text[: at + len(final)] if at >= 0 and final else text
        return text

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], []
        for i in ids:
            if 0 <= i < self.size:
                run.append(i)
                continue
            if run:
                out.append(self.tokenizer.decode(run, skip_special_tokens=False))
                run = []
            out.append(_garbage(i))
        if run:
            out.append(self.tokenizer.decode(run, skip_special_tokens=False))
        return "".join(out)


_directory: _Directory | None = None


def use(directory: Path | None) -> None:
    """Count with `directory`'s tokenizer; None (or the shipped directory): the simulator's
    own word tokens. Called once, when a simulator starts."""
    global _directory
    _directory = None if directory is None or bundled(directory) else _Directory(directory)


def bundled(directory: str | Path | None) -> bool:
    """Whether `directory` is the shipped one, whose tokens the simulator counts itself."""
    return directory is not None and Path(directory).resolve() == MODEL_DIR.resolve()


@cache
def _vocab() -> dict[str, int]:
    document = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    vocab: dict[str, int] = document["model"]["vocab"]
    return vocab


@cache
def _names() -> dict[int, str]:
    return {i: word for word, i in _vocab().items()}


def _id(piece: str) -> int:
    known = _vocab().get(piece)
    if known is not None:
        return known
    span = VOCAB_SIZE - len(_vocab())
    return len(_vocab()) + zlib.crc32(piece.encode()) % span


_MET: dict[str, int] = {}  # pieces met, with their ids: an agent tokenizes every prompt
_MET_MAX = 1 << 20  # ...up to so many (prompts' words are not bounded; the vocabulary is)


def encode(text: str) -> list[int]:
    if _directory is not None:
        return list(_directory.tokenizer.encode(text, add_special_tokens=False).ids)
    met = _MET
    pieces = _PIECES.findall(text)
    ids = [met.get(piece, -1) for piece in pieces]
    if -1 in ids:
        for n, piece in enumerate(pieces):
            if ids[n] < 0:
                ids[n] = _id(piece)
                if len(met) < _MET_MAX:
                    met[piece] = ids[n]
    return ids


def decode(ids: Sequence[int], after: str = "") -> str:
    """The text of `ids` where it follows the text `after`: words apart, as a word-level
    tokenizer detokenizes them in context (a space before the first when `after` ends in
    one's middle)."""
    if not ids:
        return ""
    if _directory is not None:  # its spaces are in its tokens
        return _directory.decode(ids)
    names = _names()
    text = " ".join(names.get(i) or _garbage(i) for i in ids)
    return " " + text if after and not after[-1].isspace() else text


def _garbage(token: int) -> str:
    """An id the vocabulary has no name for: block and shape characters, which no prompt's
    script uses (what a broken worker's bytes look like)."""
    return chr(GARBAGE_FROM + token % 0x80) + chr(GARBAGE_FROM + (token >> 7) % 0x80)


def chat_prompt(messages: Sequence[dict[str, Any]], continue_final: bool = False) -> str:
    """The shipped chat template, applied the way the tokenizer_config.json states it. With
    `continue_final` (SGLang's `continue_final_message`), a last assistant message is left
    open for the answer to go on from, and no new assistant turn is begun."""
    if _directory is not None:
        return _directory.chat(messages, continue_final)
    parts = ["<|begin_of_text|>"]
    last = len(messages) - 1
    for n, message in enumerate(messages):
        role = message.get("role", "user")
        parts.append(
            f"<|start_header_id|>{role}<|end_header_id|>\n\n{_content(message.get('content'))}"
        )
        if n == last and continue_final and role == "assistant":
            return "".join(parts)
        parts.append("<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _window(context: Sequence[int]) -> bytes:
    return array("I", (i & 0xFFFFFFFF for i in context[-_WINDOW:])).tobytes()


def _next(window: bytes) -> int:
    if _directory is not None:
        return _directory.first + zlib.crc32(window) % (_directory.size - _directory.first)
    return _SPECIAL + zlib.crc32(window) % _WORDS


def output_ids(prompt: Sequence[int], count: int, fault: str = "none") -> list[int]:
    """The `count` tokens a request generates, each a function of the context before it (the
    last few tokens of the prompt and of what came so far), as a model's greedy decoding is:
    a request continued from its prompt and its first k tokens goes on with the same tokens
    as the whole request did. `fault`: "repeat" emits one token over and over, "garbage"
    tokens outside the vocabulary."""
    if fault == "repeat":
        return [_directory.repeat if _directory is not None else REPEAT] * count
    context = list(prompt[-_WINDOW:])
    out: list[int] = []
    for _ in range(count):
        window = _window(context)
        token = _next(window)
        if fault == "garbage":  # ids past the vocabulary: they decode as shapes
            size = _directory.size if _directory is not None else len(_vocab())
            token = size + zlib.crc32(window, 7) % (VOCAB_SIZE - size)
        out.append(token)
        context.append(token)
    return out


def _unit(window: bytes, token: int, salt: int) -> float:
    """A number in [0, 1), a function of the context, the token and a salt."""
    return zlib.crc32(struct.pack("<Ii", token & 0xFFFFFFFF, salt), zlib.crc32(window)) / 2**32


def logprob(context: Sequence[int], token: int, shift: float = 0.0) -> float:
    """log P(token | context) as this simulated model has it; `shift` > 0: wrong weights,
    every log-probability lower by `shift` times a factor between 0.5 and 1.5."""
    window = _window(context)
    if token == _next(window):
        value = -0.02 - 0.3 * _unit(window, token, 1)
    else:
        value = -3.0 - 9.0 * _unit(window, token, 2)
    if shift:
        value -= shift * (0.5 + _unit(window, token, 3))
    return value


def token_logprobs(ids: Sequence[int], start: int, shift: float = 0.0) -> list[float | None]:
    """The log-probability of each of `ids` from position `start` given those before it;
    None for the first token, which has no context (as SGLang reports it)."""
    return [logprob(ids[max(0, i - _WINDOW) : i], ids[i], shift) if i else None
            for i in range(max(0, start), len(ids))]  # fmt: skip
