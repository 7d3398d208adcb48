"""LoRA adapters: what both planes agree on about one. The control plane validates an
adapter's source and digest; the agents check the files they fetch against the digest
before an engine loads them (issue 45).

An adapter is a directory as PEFT saves one (`adapter_config.json` and its weights). Its
digest is `sha256:` and the SHA-256 of a manifest of its files: for each regular file, in the
order of its path relative to the directory (`/`-separated), a line of that path, a NUL, and
the file's own SHA-256 in hex. A renamed, added, removed or changed file changes the digest;
where the directory sits does not.

A request names an adapter in OpenAI's `model` field as `base:adapter` (as SGLang accepts)
or by the adapter's name alone; names never hold a `:`, so the two cannot be confused.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
SCHEMES = ("s3",)  # object stores an adapter's source may be in, beside a path on the nodes
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://")
CHUNK = 1 << 20
LOAD_ROOM = 0.02  # of the adapters an engine holds at once, those kept free for requests' loads


def scheme_of(source: str) -> str | None:
    """The source's URI scheme (`s3`), or None for a path."""
    found = _SCHEME.match(source)
    return found.group(1) if found else None


def source_problem(source: str, digest: str | None) -> str | None:
    """Why `source` (with `digest`) cannot be an adapter's, or None: a path must be absolute;
    an object store must be one of SCHEMES, as bucket and key, and have a digest (a path on
    the nodes is the operator's own, and may go without)."""
    scheme = scheme_of(source)
    if scheme is None:
        return None if source.startswith("/") else f"a path must be absolute, not {source!r}"
    if scheme not in SCHEMES:
        return f"{scheme}:// is not an object store adapters load from (use {', '.join(SCHEMES)})"
    bucket, _, key = source[len(scheme) + 3 :].partition("/")
    if not bucket or not key.strip("/"):
        return f"an {scheme} source is {scheme}://bucket/key, not {source!r}"
    if digest is None:
        return "an adapter from an object store needs its digest, checked on every fetch"
    return None


def digest_of(directory: Path) -> str:
    """The adapter directory's digest (see the module's doc)."""
    manifest = hashlib.sha256()
    files = sorted(
        (p.relative_to(directory).as_posix(), p) for p in directory.rglob("*") if p.is_file()
    )
    for relative, path in files:
        content = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                content.update(chunk)
        manifest.update(f"{relative}\0{content.hexdigest()}\n".encode())
    return f"sha256:{manifest.hexdigest()}"


def split_model(asked: str) -> tuple[str, str | None]:
    """`base:adapter` as (base, adapter); any other name as (name, None)."""
    base, colon, adapter = asked.partition(":")
    return (base, adapter) if colon and base and adapter else (asked, None)


def planned_slots(holds: int) -> int:
    """Of the adapters an engine holds at once (`--max-loaded-loras`), those the leader's
    residency plan may keep on it: all but a few (`LOAD_ROOM`, at least one), which a request
    for an adapter the plan left out loads into without unloading a planned one. A planned
    adapter costs nothing until its place is wanted, and one left out costs its first
    request a load, so the plan keeps as many as fit. The control plane sizes its plan by it
    and the agents place the plan by it, so that what is planned is placed. An engine that
    holds one keeps it for the plan."""
    return max(min(holds, 1), holds - max(1, math.ceil(holds * LOAD_ROOM)))
