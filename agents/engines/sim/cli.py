"""`meridian sim`: one simulated SGLang server, with launch_server's flag names."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import click
import prometheus_client
import uvicorn
from pydantic import ValidationError

from agents.engines.sim import tokens
from agents.engines.sim.config import SimConfig
from agents.engines.sim.server import Simulator, bootstrap_app

SHUTDOWN_GRACE_S = 5


@click.command("sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=30000, show_default=True)
@click.option("--model", "--served-model-name", "served_model_name", required=True,
              help="the model name it serves")  # fmt: skip
@click.option("--model-path", type=click.Path(path_type=Path), default=None,
              help="reported as model_path, and its tokenizer counts the tokens (the tiny "
              "model's, say); default: the bundled word-level one")  # fmt: skip
@click.option("--tp-size", "--tp", "tp_size", type=int, default=1)
@click.option("--dp-size", "--dp", "dp_size", type=int, default=1)
@click.option("--mem-fraction-static", type=float, default=0.88)
@click.option("--max-running-requests", type=int, default=256)
@click.option("--max-total-tokens", type=int, default=None)
@click.option("--context-length", type=int, default=131072)
@click.option("--stream-interval", type=int, default=1)
@click.option("--max-prefill-tokens", type=int, default=16384)
@click.option("--chunked-prefill-size", type=int, default=8192)
@click.option("--page-size", type=int, default=1)
@click.option("--kv-events-config", default=None,
              help="JSON: publisher (zmq), endpoint (tcp://*:5557), topic")  # fmt: skip
@click.option("--schedule-policy", default="fcfs")
@click.option("--enable-priority-scheduling", is_flag=True,
              help="take waiting requests by `priority`, higher first")  # fmt: skip
@click.option("--disable-priority-preemption", is_flag=True)
@click.option("--default-priority-value", type=int, default=None)
@click.option("--schedule-low-priority-values-first", is_flag=True)
@click.option("--priority-scheduling-preemption-threshold", type=int, default=10)
@click.option("--retraction-policy", type=click.Choice(["length", "priority"]), default="length",
              help="who is retracted first when the KV pool is short: the shortest answer so "
              "far (length), or the lowest priority, then so (priority)")  # fmt: skip
@click.option(
    "--disaggregation-mode", type=click.Choice(["null", "prefill", "decode"]), default="null"
)
@click.option("--disaggregation-bootstrap-port", type=int, default=8998)
@click.option("--enable-metrics", is_flag=True)
@click.option("--enable-cache-report", is_flag=True)
@click.option("--enable-lora", is_flag=True, help="serve LoRA adapters loaded at run time")
@click.option("--max-lora-rank", type=int, default=None)
@click.option("--lora-target-modules", default=None, help="as SGLang's (all, or module names)")
@click.option("--max-loras-per-batch", type=int, default=8)
@click.option("--max-loaded-loras", type=int, default=None,
              help="past it the least recently used adapter is unloaded")  # fmt: skip
@click.option("--lora-backend", default="csgmv", help="accepted, as SGLang's; nothing changes")
@click.option("--lora-load-s", type=float, default=0.05, help="seconds to load an adapter")
@click.option("--lora-paths", multiple=True,
              help="name=path, again for each: adapters it knows from the start, as if loaded "
              "once and unloaded since (a request naming one loads it)")  # fmt: skip
@click.option("--startup-s", type=float, default=0.0, help="seconds before /health turns 200")
@click.option("--speed-factor", type=float, default=1.0,
              help="the engine's hardware speed: 2 runs every step in half the time")  # fmt: skip
@click.option("--slow-factor", type=float, default=1.0,
              help="fault: multiplies every step's time (changeable at /sim/faults)")  # fmt: skip
@click.option("--error-rate", type=float, default=0.0, help="fraction of requests answered 500")
@click.option("--hang", is_flag=True, help="start hung: no step runs, /health never answers")
@click.option("--crash-after-s", type=float, default=None, help="exit abruptly after this long")
@click.option("--seed", type=int, default=0)
@click.option("--fail-marker", default=None,
              help="requests whose prompt holds <marker>:json|tool|length|logprob answer "
              "wrong that way (tiered routes' cascades are tested with it)")  # fmt: skip
def sim_command(**options: Any) -> None:
    """Serve SGLang's HTTP API from a calibrated simulator (no GPU, no weights).

    Costs follow SGLang serving Llama-3.1-8B on one H100; see agents/engines/sim/cost.py.
    """
    options = {k: v for k, v in options.items() if v is not None and v != ()}
    try:
        if "kv_events_config" in options:
            options["kv_events_config"] = json.loads(options["kv_events_config"])
        config = SimConfig(**options)
    except json.JSONDecodeError as error:
        raise click.UsageError(f"--kv-events-config: not JSON: {error}") from error
    except ValidationError as error:
        first = error.errors()[0]
        where = f"--{str(first['loc'][0]).replace('_', '-')}: " if first["loc"] else ""
        raise click.UsageError(f"{where}{first['msg']}") from error
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    asyncio.run(serve(config))


async def serve(config: SimConfig) -> None:
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # SGLang publishes no `_created` series
    tokens.use(config.model_path)  # its tokenizer, when it is not the shipped one
    simulator = Simulator(config)
    servers = [_server(simulator.app(), config.host, config.port, lifespan="on")]
    if config.role == "prefill":
        kv_app = bootstrap_app(simulator.kv)
        servers.append(_server(kv_app, config.host, config.disaggregation_bootstrap_port, "off"))
    await asyncio.gather(*(s.serve() for s in servers))


def _server(app: Any, host: str, port: int, lifespan: str) -> uvicorn.Server:
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan=lifespan,  # type: ignore[arg-type]
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
    )
