"""The supervisor with the simulator as a real child process: crash, restart, backoff, crash
loop, hang, drain."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from agents.engines import ports
from agents.engines.backends import backends
from agents.engines.base import Backend, EngineSpec, Scalar
from agents.engines.children import start_ticks
from agents.engines.runner import EngineRunner, EngineState, backoff_s
from agents.engines.supervisor import Supervisor
from agents.settings import AgentSettings
from agents.workers.poller import LoadPoller
from agents.workers.table import WorkerTable
from meridian.procs import free_port
from tests.kits.sim import running_sim

SETTINGS = AgentSettings(
    control_plane="127.0.0.1:1",
    region="test",
    probe_interval_s=0.2,
    probe_timeout_s=0.5,
    restart_backoff_s=0.2,
    restart_backoff_max_s=5,
    crash_loop_restarts=3,
    drain_timeout_s=10,
    stop_grace_s=3,
)


def sim_spec(engine_id: str = "d/unified-0", args: dict[str, Scalar] | None = None) -> EngineSpec:
    port = free_port()
    return EngineSpec(
        id=engine_id,
        deployment="d",
        model="llama",
        backend="sim",
        role="unified",
        url=f"http://127.0.0.1:{port}",
        port=port,
        gpu_indexes=(0,),
        engine_args=tuple(sorted((args or {}).items())),
    )


def start(
    tmp_path: Path, found: dict[str, Backend] | None = None
) -> tuple[Supervisor, asyncio.Task[None]]:
    """A supervisor and its engines' load poller (what drains and health checks read), as an
    agent runs them: the supervisor stops its engines (drained) before the poller stops."""
    poller = LoadPoller(WorkerTable(), 0.1, SETTINGS.probe_timeout_s, local=lambda: sup.engines())
    sup = Supervisor(SETTINGS, found or backends(), tmp_path, observe=poller.observed)

    async def both() -> None:
        polling = asyncio.create_task(poller.run())
        try:
            await sup.run()
        finally:
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)

    return sup, asyncio.create_task(both())


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    sup, task = start(tmp_path)
    yield sup
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def until(check: Callable[[], bool], within_s: float = 20) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - state changes in another task, no event to share
            await asyncio.sleep(0.05)


def runner(sup: Supervisor, spec: EngineSpec) -> EngineRunner:
    return sup.runners[spec.id]


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


async def test_a_crashed_engine_is_restarted(supervisor: Supervisor) -> None:
    spec = sim_spec()
    started = asyncio.get_running_loop().time()  # before its launch: the test's own measure
    supervisor.want([spec])
    await until(lambda: spec.id in supervisor.runners)
    engine = runner(supervisor, spec)
    await until(lambda: engine.state is EngineState.READY)
    first_pid, first_start = engine.pid, engine.ready_after_s
    # launch to ready: a moment, within what the test waited for it
    assert 0 < first_start <= asyncio.get_running_loop().time() - started
    async with httpx.AsyncClient() as client:
        await client.post(f"{spec.url}/sim/faults", json={"crash": True})
    await until(lambda: engine.restarts == 1 and engine.state is EngineState.READY)
    assert engine.pid is not None
    assert engine.pid != first_pid
    assert engine.last_exit == 70
    assert engine.ready_after_s > 0  # the new start's
    assert supervisor.status()[0]["ready_after_s"] == engine.ready_after_s


async def test_an_engine_that_keeps_failing_ends_in_crash_loop(supervisor: Supervisor) -> None:
    spec = sim_spec(args={"max-running-requests": 0})  # the simulator refuses it and exits 2
    supervisor.want([spec])
    await until(lambda: spec.id in supervisor.runners)
    engine = runner(supervisor, spec)
    await until(lambda: engine.state is EngineState.CRASH_LOOP)
    assert engine.restarts == SETTINGS.crash_loop_restarts - 1
    assert engine.last_exit == 2
    assert "3 failures in a row" in engine.reason
    await asyncio.sleep(1.0)
    assert engine.restarts == SETTINGS.crash_loop_restarts - 1  # it stays down
    status = supervisor.status()[0]
    assert status["state"] == "crash_loop"
    assert status["pid"] is None


async def test_a_hung_engine_turns_unhealthy_and_is_restarted(supervisor: Supervisor) -> None:
    spec = sim_spec()
    supervisor.want([spec])
    await until(lambda: spec.id in supervisor.runners)
    engine = runner(supervisor, spec)
    await until(lambda: engine.state is EngineState.READY)
    async with httpx.AsyncClient() as client:
        await client.post(f"{spec.url}/sim/faults", json={"hang": True})
    await until(lambda: engine.state is EngineState.UNHEALTHY)
    await until(lambda: engine.restarts == 1 and engine.state is EngineState.READY)


async def test_stopping_drains_running_requests_first(supervisor: Supervisor) -> None:
    spec = sim_spec(args={"slow-factor": 15})
    supervisor.want([spec])
    await until(lambda: spec.id in supervisor.runners)
    engine = runner(supervisor, spec)
    await until(lambda: engine.state is EngineState.READY)
    pid = engine.pid
    assert pid is not None
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"text": "finish me", "sampling_params": {"max_new_tokens": 12}}
        call = asyncio.create_task(client.post(f"{spec.url}/generate", json=body))
        await until(lambda: engine.load.running == 1)
        supervisor.want([])
        await until(lambda: engine.state is EngineState.DRAINING)
        answer = await call
    await supervisor.settled()
    assert answer.status_code == 200
    assert answer.json()["meta_info"]["completion_tokens"] == 12
    assert engine.state is EngineState.STOPPED
    assert supervisor.runners == {}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_changed_spec_replaces_the_engine_and_others_are_left_alone(
    supervisor: Supervisor,
) -> None:
    keep, change = sim_spec("keep/unified-0"), sim_spec("change/unified-0")
    supervisor.want([keep, change])
    await until(lambda: len(supervisor.ready()) == 2)
    kept_pid, old_pid = supervisor.runners[keep.id].pid, supervisor.runners[change.id].pid
    changed = EngineSpec(**{**change.__dict__, "engine_args": (("stream-interval", 2),)})
    supervisor.want([keep, changed])
    await supervisor.settled()
    await until(lambda: len(supervisor.ready()) == 2)
    assert supervisor.runners[keep.id].pid == kept_pid
    assert supervisor.runners[change.id].pid != old_pid
    assert supervisor.runners[change.id].spec == changed


async def test_an_external_engine_is_probed_and_never_launched(supervisor: Supervisor) -> None:
    async with running_sim() as sim:
        up = EngineSpec("ext/external-0", "ext", "llama", "external", "unified", sim.url)
        gone = EngineSpec(
            "ext/external-1",
            "ext",
            "llama",
            "external",
            "unified",
            f"http://127.0.0.1:{free_port()}",
        )
        supervisor.want([up, gone])
        await until(lambda: len(supervisor.runners) == 2)
        await until(lambda: supervisor.runners[up.id].state is EngineState.READY)
        await until(lambda: supervisor.runners[gone.id].state is EngineState.UNHEALTHY)
        assert all(r.pid is None and r.process is None for r in supervisor.runners.values())
        supervisor.want([])
        await supervisor.settled()
        assert sim.process.returncode is None  # stopping an external engine leaves it running


async def _abandon(sup: Supervisor, task: asyncio.Task[None]) -> None:
    """What an agent killed outright does: leave its engines running, unsupervised."""
    for engine in sup.runners.values():
        assert engine._task is not None
        engine._task.cancel()
    sup.runners.clear()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_new_supervisor_adopts_a_wanted_engine_and_stops_strays(tmp_path: Path) -> None:
    wanted, stray = sim_spec("wanted/unified-0"), sim_spec("stray/unified-0")
    old, old_task = start(tmp_path)
    old.want([wanted, stray])
    await until(lambda: len(old.ready()) == 2)
    pids = {i: r.pid for i, r in old.runners.items()}
    await _abandon(old, old_task)

    new, new_task = start(tmp_path)
    try:
        new.want([wanted])
        await until(lambda: len(new.ready()) == 1)
        assert new.runners[wanted.id].pid == pids[wanted.id]
        assert new.runners[wanted.id].ready_after_s == 0  # taken over: its start not known
        await until(lambda: start_ticks(pids[stray.id] or 0) is None)
    finally:
        new_task.cancel()
        await asyncio.gather(new_task, return_exceptions=True)
    assert start_ticks(pids[wanted.id] or 0) is None  # stopped with its new supervisor


async def test_an_engine_whose_port_another_process_holds_is_never_ready(
    supervisor: Supervisor,
) -> None:
    spec = sim_spec()
    async with running_sim(model="impostor", port=spec.port) as impostor:  # answers /health
        supervisor.want([spec])
        await until(lambda: spec.id in supervisor.runners)
        engine = runner(supervisor, spec)
        states = set()

        def seen() -> bool:
            states.add(engine.state)
            return engine.state is EngineState.CRASH_LOOP

        await until(seen)
        assert EngineState.READY not in states  # never taken for the impostor
        assert f"port {spec.port} is held by another process, pid" in engine.reason
        assert "impostor" in engine.reason  # its command line names it
        assert impostor.process.returncode is None  # and it was left alone
        group = os.getpgid(impostor.process.pid)
        assert ports.owned("127.0.0.1", spec.port, group)
        assert ports.held_by_others("127.0.0.1", spec.port, group) is None
        assert ports.owned("127.0.0.1", spec.port, group + 1_000_000) is False
        assert ports.owned("::", spec.port, group)  # any address takes 127.0.0.1's
        # another loopback address is another place: regions of a local fleet share ports
        assert ports.held_by_others("127.0.0.2", spec.port) is None


async def test_a_spec_change_rolls_through_a_deployment_one_engine_at_a_time(
    supervisor: Supervisor,
) -> None:
    specs = [sim_spec(f"d/unified-{i}") for i in range(3)]
    for i, spec in enumerate(specs):
        specs[i] = EngineSpec(**{**spec.__dict__, "gpu_indexes": (i,)})
    supervisor.want(specs)
    await until(lambda: len(supervisor.ready()) == 3)
    old = {s.id: supervisor.runners[s.id].pid for s in specs}
    args = (("stream-interval", 2),)
    changed = [EngineSpec(**{**s.__dict__, "engine_args": args}) for s in specs]
    supervisor.want(changed)
    serving: list[int] = []
    while not all(
        s.id in supervisor.runners and supervisor.runners[s.id].spec == s
        and supervisor.runners[s.id].state is EngineState.READY for s in changed
    ):  # fmt: skip
        serving.append(len(supervisor.ready()))
        assert len(supervisor.retiring) <= 1  # never two of the deployment at once
        await asyncio.sleep(0.02)
    assert min(serving) == 2  # one at a time: the other two serve throughout
    assert all(supervisor.runners[i].pid != pid for i, pid in old.items())


async def test_a_new_engine_starts_beside_a_draining_one_unless_they_share_a_gpu(
    supervisor: Supervisor,
) -> None:
    slow = sim_spec("d/unified-0", args={"slow-factor": 15})
    supervisor.want([slow])
    await until(lambda: len(supervisor.ready()) == 1)
    engine = supervisor.runners[slow.id]
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"text": "finish me", "sampling_params": {"max_new_tokens": 12}}
        call = asyncio.create_task(client.post(f"{slow.url}/generate", json=body))
        await until(lambda: engine.load.running == 1)
        # its steps slow to 1.8 s until the checks below are done, however long the new
        # engine takes to start on a busy machine
        await client.post(f"{slow.url}/sim/faults", json={"slow_factor": 300})
        elsewhere = EngineSpec(**{**sim_spec("d/unified-1").__dict__, "gpu_indexes": (1,)})
        same_gpu = sim_spec("e/unified-0")  # GPU 0, the draining engine's
        supervisor.want([elsewhere, same_gpu])
        await until(lambda: elsewhere.id in supervisor.runners)
        await until(lambda: supervisor.runners[elsewhere.id].state is EngineState.READY)
        assert engine.state is EngineState.DRAINING  # surge: the new one serves already
        assert same_gpu.id not in supervisor.runners  # it waits for GPU 0
        await client.post(f"{slow.url}/sim/faults", json={"slow_factor": 1})
        answer = await call
    assert answer.json()["meta_info"]["completion_tokens"] == 12  # the drain finished it
    await supervisor.settled()
    assert str(engine.state) == "stopped"  # (read again: mypy narrowed it above)
    assert supervisor.runners[same_gpu.id].spec == same_gpu


async def test_an_engine_that_cannot_be_started_stops_no_other(tmp_path: Path) -> None:
    """One engine's start fails (its backend is not on this node): it is logged and tried
    again, and the engine beside it starts, serves and is left running; the supervisor goes
    on reconciling."""
    sim = backends()["sim"]
    sup, task = start(tmp_path, {"sim": sim})
    try:
        broken = dataclasses.replace(sim_spec("d/a-external"), backend="external")
        spec = sim_spec("d/b-unified")
        sup.want([broken, spec])
        await until(lambda: spec.id in sup.runners)
        engine = runner(sup, spec)
        await until(lambda: engine.state is EngineState.READY)
        pid = engine.pid
        await asyncio.sleep(1.5)  # a retry of the broken one, at least
        assert not task.done()
        assert engine.state is EngineState.READY
        assert engine.pid == pid
        assert broken.id not in sup.runners
        # the broken engine taken out of the snapshot: all is settled
        sup.want([spec])
        async with asyncio.timeout(10):
            await sup.settled()
        assert engine.pid == pid
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
