"""What tests want a reader of the run to see at its end (the root conftest prints it): the
chaos scenarios' counts, the fuzzing's cases. A test adds lines to a section.

Lines travel with the test's report (its `user_properties`), so that they reach the end of
the run from pytest-xdist's workers as from a run in one process."""

from __future__ import annotations

KEY = "meridian-report"
SECTIONS: dict[str, list[str]] = {}  # what the run collected from its tests' reports
PENDING: list[tuple[str, str]] = []  # added by the test now running, not yet reported
_STARTED: set[str] = set()  # sections this process has added to


def add(section: str, line: str, header: str | None = None) -> None:
    """`header`: the section's first line, added before the first line this process adds."""
    if header is not None and section not in _STARTED:
        PENDING.append((section, header))
    _STARTED.add(section)
    PENDING.append((section, line))


def taken() -> list[tuple[str, str]]:
    lines = list(PENDING)
    PENDING.clear()
    return lines


def collect(properties: list[tuple[str, object]]) -> None:
    for key, value in properties:
        if key == KEY and isinstance(value, (list, tuple)) and len(value) == 2:
            section, line = value
            SECTIONS.setdefault(str(section), []).append(str(line))
