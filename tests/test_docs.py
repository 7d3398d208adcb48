"""The docs stay true to the command: every `meridian` command line in the README and the
guides (in shell blocks and in inline code) names subcommands and flags that exist, and the
README stays a front door."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from meridian.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "bench" / "README.md",
    ROOT / "terraform" / "README.md",
]
FENCE = re.compile(r"```([a-z]*)\n(.*?)```", re.DOTALL)
SHELL = {"bash", "sh", "shell", "console"}
SPAN = re.compile(r"`([^`\n]+)`")
ENDS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "<"}
ALIASES = {"./scripts/up": ["up"]}  # scripts/up passes its arguments to `meridian up`


def command_lines(text: str) -> list[list[str]]:
    """The arguments of each `meridian` command in a document's shell blocks and code spans."""
    found: list[list[str]] = []
    for language, block in FENCE.findall(text):
        if language not in SHELL:
            continue  # a picture, a fleet document, Python
        for line in block.replace("\\\n", " ").splitlines():
            found += _in_line(line)
    for span in SPAN.findall(FENCE.sub("", text)):
        found += _in_line(span)
    return found


def _in_line(line: str) -> list[list[str]]:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # prose in a code span, not a command
        return []
    out = []
    for i, token in enumerate(tokens):
        if token == "meridian" or token.endswith("bin/meridian") or token in ALIASES:
            args = list(ALIASES.get(token, []))
            for arg in tokens[i + 1 :]:
                if arg in ENDS:
                    break
                args.append(arg)
            out.append(args)
    return out


def problem(args: list[str]) -> str | None:
    """Why `meridian ARGS` would be refused for a subcommand or a flag that is not there."""
    command: click.Command = main
    context = click.Context(main)
    path = ["meridian"]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            option = _option(command, name)
            if option is None:
                return f"`{' '.join(path)}` has no option {name}"
            if not (option.is_flag or option.count or "=" in arg):
                i += 1  # its value
        elif isinstance(command, click.Group):
            sub = command.get_command(context, arg)
            if sub is None:
                return f"`{' '.join(path)}` has no subcommand {arg!r}"
            command, path = sub, [*path, arg]
        i += 1
    return None


def _option(command: click.Command, name: str) -> click.Option | None:
    if name in ("--help", "-h"):
        return click.Option(["--help"], is_flag=True)
    for param in command.params:
        if isinstance(param, click.Option) and name in param.opts + param.secondary_opts:
            return param
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_meridian_command_the_docs_show_exists(doc: Path) -> None:
    lines = command_lines(doc.read_text())
    wrong = [f"meridian {' '.join(a)}: {why}" for a in lines if (why := problem(a))]
    assert not wrong, "\n".join(wrong)


def test_the_docs_show_commands_and_the_check_can_fail() -> None:
    every = [a for doc in DOCS for a in command_lines(doc.read_text())]
    assert len(every) >= 40
    assert {a[0] for a in every if a} >= {"up", "apply", "bench", "demo", "controlplane"}
    assert problem(["bench", "propagation", "--agent", "5"]) is not None
    assert problem(["bench", "propogation"]) is not None
    assert problem(["up", "--no-browser"]) is None


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for guide in re.findall(r"\]\(([^)#]+)\)", readme):
        if not guide.startswith("http"):
            assert (ROOT / guide).exists(), guide
