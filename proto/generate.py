"""Generate the Python package of the wire contract from the .proto sources.

    python proto/generate.py            # rewrite the committed files in proto/
    python proto/generate.py --out DIR  # write them under DIR instead (the test compares)

Messages get typed stubs from mypy-protobuf, so the code that uses them is type-checked.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent
SOURCES = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("meridian_pb/**/*.proto"))
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generated_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("meridian_pb/**/*") if p.name.endswith(SUFFIXES))


def generate(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    bindir = Path(sys.executable).parent
    plugins = [
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
    ]
    include = Path(protoc.__file__).parent / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *plugins,
        *SOURCES,
    ]
    if protoc.main(argv) != 0:
        raise SystemExit("protoc failed")
    return generated_files(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.out is not None:
        generate(args.out)
        return
    scratch = ROOT / ".generated"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for path in generate(scratch):
            target = ROOT / path.relative_to(scratch)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            print(target.relative_to(ROOT.parent))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
