"""`meridian engines`: what the real SGLang needs on this machine: its own environment, a
tiny model made here and LoRA adapters of it; and an adapter's digest."""

from __future__ import annotations

import time
from pathlib import Path

import click
from meridian_pb.fleet.v1.adapters import digest_of
from rich.console import Console

from agents.engines import sglang_env, tiny_model

LOG_EVERY_S = 20.0


@click.group("engines")
def engines() -> None:
    """The real SGLang: its environment and a tiny model to serve on a CPU."""


@engines.command("tiny-model")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--seed", type=int, default=0, show_default=True)
def tiny_model_command(directory: Path, seed: int) -> None:
    """Write a tiny random-weights Llama into DIRECTORY (its tokenizer trained here).

    The same seed writes the same files; nothing is downloaded. SGLang serves it on a CPU.
    """
    started = time.monotonic()
    tiny_model.write(directory, seed)
    click.echo(f"{directory}: a tiny Llama (seed {seed}) in {time.monotonic() - started:.1f} s")


@engines.command("tiny-adapter")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="the tiny model it adapts (`meridian engines tiny-model`)",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--rank", type=click.IntRange(1, 64), default=4, show_default=True)
def tiny_adapter_command(directory: Path, model_dir: Path, seed: int, rank: int) -> None:
    """Write a LoRA adapter of the tiny model into DIRECTORY, as PEFT saves one (random
    weights from the seed), and print its digest (what an adapter's `digest` holds)."""
    tiny_model.write_adapter(directory, model_dir, seed, rank)
    click.echo(f"{directory}: a rank-{rank} adapter of {model_dir} (seed {seed}), "
               f"{digest_of(directory)}")  # fmt: skip


@engines.command("adapter-digest")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False, exists=True))
def adapter_digest_command(directory: Path) -> None:
    """Print the digest of the LoRA adapter in DIRECTORY, as an adapter's `digest` holds it
    and the agents check it on every fetch (the SHA-256 of its files' manifest)."""
    if not any(p.is_file() for p in directory.rglob("*")):
        raise click.UsageError(f"{directory} holds no files")
    click.echo(digest_of(directory))


@engines.command("sglang-env")
@click.option("--home", type=click.Path(path_type=Path, file_okay=False),
              envvar="MERIDIAN_SGLANG_HOME", default=None,
              help="where environments are kept (default ~/.cache/meridian)")  # fmt: skip
@click.option("--install", is_flag=True, help="install it if it is not there")
def sglang_env_command(home: Path | None, install: bool) -> None:
    """Print the Python of SGLang's own environment (installing it with --install).

    It holds sglang==%s and nothing of Meridian's: about 11 GB, 4 to 6 minutes to install.
    """
    directory = sglang_env.env_dir(home)
    if not sglang_env.installed(directory):
        if not install:
            raise click.ClickException(
                f"SGLang {sglang_env.SGLANG_VERSION} is not installed at {directory}: "
                "run `meridian engines sglang-env --install`"
            )
        install_env(directory)
    click.echo(sglang_env.python_of(directory))


sglang_env_command.help = (sglang_env_command.help or "") % sglang_env.SGLANG_VERSION


def install_env(directory: Path) -> None:
    """pip's progress on one live line in a terminal; elsewhere (CI's log) a line every
    `LOG_EVERY_S` seconds."""
    console = Console(stderr=True)
    started = last_said = time.monotonic()
    what = f"installing sglang=={sglang_env.SGLANG_VERSION} into {directory}"
    with console.status(what) as status:
        if not console.is_terminal:
            console.print(what)

        def on_line(line: str) -> None:
            nonlocal last_said
            if not line.startswith(("Collecting", "Installing", "Downloading", "Successfully")):
                return
            now = time.monotonic()
            said = f"[{now - started:4.0f} s] {line[:100]}"
            if console.is_terminal:
                status.update(said)
            elif now - last_said >= LOG_EVERY_S:
                console.print(said)
                last_said = now

        try:
            sglang_env.install(directory, on_line)
        except RuntimeError as error:
            raise click.ClickException(str(error)) from error
    console.print(f"SGLang installed at {directory} in {time.monotonic() - started:.0f} s")
