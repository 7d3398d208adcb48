"""What tests want a reader of the run to see at its end (the root conftest prints it): the
chaos scenarios' counts, the fuzzing's cases. A test adds lines to a section."""

from __future__ import annotations

SECTIONS: dict[str, list[str]] = {}


def add(section: str, line: str) -> None:
    SECTIONS.setdefault(section, []).append(line)
