"""The built-in difficulty classifier of tiered routes: which features it reads from a
request, and where the built-in table and an operator's table put requests."""

from __future__ import annotations

from meridian_pb.fleet.v1.features import Table, default_table

from agents.router.tiers import SCAN_CHARS, features, last_turn


def _tier(text: str, tokens: int = 20, **given: object) -> int:
    messages = [{"role": "user", "content": text}]
    options: dict[str, object] = {"max_new": None, "tools": False, "json_wanted": False,
                                  "effort": None} | given  # fmt: skip
    found = features(messages, None, tokens, **options)  # type: ignore[arg-type]
    return default_table(2).tier(found)[0]


def test_the_built_in_table_sends_plain_questions_cheap_and_hard_ones_strong() -> None:
    assert _tier("What is the capital of France?") == 0
    assert _tier("Summarise this: " + "river " * 300, tokens=320) == 0
    assert _tier("```python\ndef f(x):\n    return x\n```\nWhy is it slow?") == 1
    assert _tier("Prove that the integral of 2x is x^2 = 4 at x = 2.") == 1
    assert _tier("Hi there", effort="high") == 1
    assert _tier("Hi there", effort="low") == 0
    assert _tier("Look this up", tools=True) == 0  # tools alone are not hard
    assert _tier("word " * 9000, tokens=9000) == 1  # thousands of tokens are


def test_features_read_the_last_user_turn_and_the_conversation_depth() -> None:
    messages = [
        {"role": "system", "content": "```def class return```"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "what now?"}]},
    ]
    found = features(messages, None, 40, 512, True, True, "medium")
    assert found["code"] == 0.0  # the system prompt's code is not this turn's
    assert found["turns"] == 1.0
    assert (found["tools"], found["json"]) == (1.0, 1.0)
    assert abs(found["reasoning"] - 2 / 3) < 1e-9
    assert found["max_tokens_log2"] > 8.9
    long = "a" * (SCAN_CHARS * 4) + "```"
    assert len(last_turn(None, long)) <= SCAN_CHARS + 1  # its head and its tail
    assert last_turn(None, long).endswith("```")


def test_an_operators_table_cuts_the_score_into_its_tiers() -> None:
    table = Table(0.0, {"code": 1.0, "math": 1.0}, (0.5, 1.5))
    assert table.tier({"code": 0.0, "math": 0.0}) == (0, 0.0)
    assert table.tier({"code": 1.0})[0] == 1
    assert table.tier({"code": 1.0, "math": 1.0})[0] == 2
    assert table.tier_of(0.5) == 1  # a score on a threshold goes up
