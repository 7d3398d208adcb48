"""`meridian agent run`: one node agent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click
import uvloop
from pydantic import ValidationError

from agents.control.store import Store
from agents.daemon import Agent
from agents.settings import AgentSettings


@click.group("agent")
def agent() -> None:
    """Run a node agent."""


@agent.command("run")
@click.option("--control-plane", help="HOST:PORT of the control plane's gRPC port")
@click.option("--region", help="the region this node serves")
@click.option("--bootstrap-token", help="the region's bootstrap token (first start only)")
@click.option(
    "--bootstrap-token-command",
    help="a shell command that prints the bootstrap token, run whenever the agent registers",
)
@click.option("--data-dir", type=click.Path(path_type=Path), help="identity and last snapshot")
@click.option("--host", help="address of the agent's HTTP port")
@click.option("--port", type=int, help="the agent's HTTP port (/agent/status, /healthz)")
@click.option("--node", help="the node to claim; default: the one on disk, or by hostname")
@click.option("--hostname", help="this machine's name as the control plane knows it")
@click.option("--tls-ca-file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--tls-cert-file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--tls-key-file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--heartbeat-s", type=float)
def run(**options: Any) -> None:
    """Register, keep the stream to the control plane, and run this node's engines.

    Flags override MERIDIAN_AGENT_* variables. With the control plane down, it starts from
    the last good snapshot in --data-dir.
    """
    given = {k: v for k, v in options.items() if v is not None}
    try:
        settings = AgentSettings(**given)
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]).replace("_", "-") if first["loc"] else "settings"
        raise click.UsageError(f"--{name}: {first['msg']}") from error
    no_token = settings.bootstrap_token is None and settings.bootstrap_token_command is None
    if no_token and Store(settings.data_dir).load_identity() is None:
        raise click.UsageError(
            f"{settings.data_dir} holds no agent identity yet: give --bootstrap-token (or "
            "--bootstrap-token-command) for the first start (POST /v1/bootstrap-tokens on the "
            "control plane makes one)"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request at INFO: the engines' probes, three every two seconds each
    logging.getLogger("httpx").setLevel(logging.WARNING)
    uvloop.run(Agent(settings).serve())
