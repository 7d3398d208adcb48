"""The built-in difficulty classifier of tiered routes: a weighted sum of features the gateway
already has, cut into tiers by thresholds. No I/O, no model: a few passes over at
most `SCAN_CHARS` of the last user turn, well under a millisecond a request.

The table (bias, a weight per feature, and one threshold per boundary between tiers, in
ascending order) is the operator's to replace, per tiered route. A score below the first
threshold is the cheapest tier; at or above the last, the strongest.

Features (each a number; 0 when it does not apply):

- `prompt_tokens_log2`: log2(1 + the prompt's estimated tokens);
- `max_tokens_log2`: log2(1 + the answer's most tokens, when the request sets them);
- `turns`: the user turns before the last (conversation depth), at most 32;
- `tools`: 1 when tools are offered;
- `json`: 1 when `response_format` asks for JSON;
- `code`: code markers in the last user turn (fences, `def `, `class `, `#include`, lines
  ending in `;`, ...: `CODE_MARKS`), 1 from `MARKS_FOR_ONE` of them;
- `math`: math markers likewise (LaTeX, `prove`, `integral`, `3x^2`, `2 = 4`, ...);
- `reasoning`: the reasoning effort asked for (`reasoning_effort` low, medium, high: 1/3,
  2/3, 1; or 1 when a chat template's `enable_thinking` is set).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

SCAN_CHARS = 16_384  # of the last user turn: its head and tail, half each
MARKS_FOR_ONE = 3
MAX_TURNS = 32
EFFORT = MappingProxyType({"minimal": 0.0, "low": 1 / 3, "medium": 2 / 3, "high": 1.0})

# Literal markers, counted in the lowered text (str.count: a pass in C each; a regex of many
# alternatives costs twenty times as much on a long prompt)
CODE_MARKS = ("```", "def ", "class ", "function", "#include", "import ", "=>", "select ",
              "return", "std::", "public static", "console.log", "};\n", ";\n")  # fmt: skip
MATH_MARKS = ("\\frac", "\\int", "\\sum", "\\sqrt", "\\begin", "prove", "proof", "theorem",
              "lemma", "integral", "derivative", "equation", "solve for", "matrix", "eigen",
              "probability")  # fmt: skip
_EQUATION = re.compile(r"\d\s*[\^=]\s*\d")  # 3x^2, 2 = 4


def features(
    messages: Sequence[Any] | None,
    text: str | None,
    prompt_tokens: int,
    max_new: int | None,
    tools: bool,
    json_wanted: bool,
    effort: Any,
) -> dict[str, float]:
    """What the classifier scores, from what the gateway parsed already."""
    last = last_turn(messages, text)
    lowered = last.lower()
    turns = _users(messages) - 1 if messages is not None else 0
    return {
        "prompt_tokens_log2": math.log2(1 + max(0, prompt_tokens)),
        "max_tokens_log2": math.log2(1 + max_new) if max_new else 0.0,
        "turns": float(min(max(0, turns), MAX_TURNS)),
        "tools": 1.0 if tools else 0.0,
        "json": 1.0 if json_wanted else 0.0,
        "code": _marks(CODE_MARKS, lowered),
        "math": _marks(MATH_MARKS, lowered, _EQUATION),
        "reasoning": _effort(effort),
    }


def _marks(marks: tuple[str, ...], text: str, pattern: re.Pattern[str] | None = None) -> float:
    found = 0
    for mark in marks:
        found += text.count(mark)
        if found >= MARKS_FOR_ONE:
            return 1.0
    if pattern is not None:
        for _ in pattern.finditer(text):
            found += 1
            if found >= MARKS_FOR_ONE:
                return 1.0
    return found / MARKS_FOR_ONE


def _effort(effort: Any) -> float:
    if effort is True:
        return 1.0
    if isinstance(effort, str):
        return EFFORT.get(effort.lower(), 0.0)
    return 0.0


def last_turn(messages: Sequence[Any] | None, text: str | None) -> str:
    """What the classifier reads: the last user message (or the prompt), at most SCAN_CHARS
    of it (its head and its tail)."""
    last = text or ""
    if messages is not None:
        content = next(
            (m.get("content") for m in reversed(messages)
             if isinstance(m, dict) and m.get("role") == "user"),
            "",
        )  # fmt: skip
        if isinstance(content, list):
            content = "\n".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
        last = content if isinstance(content, str) else ""
    if len(last) > SCAN_CHARS:
        half = SCAN_CHARS // 2
        last = last[:half] + "\n" + last[-half:]
    return last


def _users(messages: Sequence[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")
