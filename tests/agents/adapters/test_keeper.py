"""The adapter keeper against a simulated engine (a real process): a new version replaces the
one the engine holds, an adapter gone from the snapshot is unloaded, one whose files do not
match their digest is never loaded (and is not tried again at once in the background), and
the leader's plan is loaded on the engines every agent would choose alike."""

from __future__ import annotations

from pathlib import Path

from meridian_pb.fleet.v1.adapters import digest_of

from agents.adapter_config import AdapterConfig
from agents.adapters.files import AdapterFiles
from agents.adapters.keeper import AdapterKeeper
from agents.config import WorkerSpec
from agents.engines import contract, tiny_model
from agents.workers.table import READY, WorkerTable
from meridian.procs import free_port
from tests.kits.sim import running_sim

LORA = ("--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all",
        "--lora-load-s", "0")  # fmt: skip


def _adapter(path: Path, digest: str | None = None, resident: int = 0) -> AdapterConfig:
    return AdapterConfig("support", "llama", str(path), digest or digest_of(path), 4,
                         frozenset({"acme"}), resident)  # fmt: skip


async def test_versions_removal_a_bad_digest_and_the_plan(tmp_path: Path) -> None:
    v1 = tiny_model.write_adapter(tmp_path / "v1", tmp_path, seed=1)
    v2 = tiny_model.write_adapter(tmp_path / "v2", tmp_path, seed=2)
    async with running_sim(*LORA) as sim, sim.client() as http:
        table = WorkerTable()
        table.replace([WorkerSpec("e", "llama", "d", "unified", sim.url, None)])
        info = (await http.get("/server_info")).json()
        table.described("e", contract.read_server_info(info))
        table.set_engine_state("e", READY)
        clock = [0.0]
        keeper = AdapterKeeper(table, AdapterFiles(tmp_path / "cache"), local=lambda: ["e"],
                               clock=lambda: clock[0])  # fmt: skip

        async def held() -> dict[str, str]:
            return contract.read_adapters((await http.get("/v1/models")).json())

        # planned on one engine: the only one there is, and loaded without a request
        keeper.configure({"support": _adapter(v1, resident=1)})
        assert keeper.planned(keeper.adapters["support"]) == ["e"]
        await keeper.tidy()
        first = str(keeper.files.place(keeper.adapters["support"]))
        assert await held() == {"support": first}
        assert keeper.counts["support"].cold_loads == 0  # no request waited for it
        # a new version: it replaces the one held
        keeper.configure({"support": _adapter(v2, resident=1)})
        await keeper.tidy()
        second = str(keeper.files.place(keeper.adapters["support"]))
        assert second != first
        assert await held() == {"support": second}
        assert table.entries["e"].adapters == {"support": second}
        # files that are not what was registered: never loaded, not tried again at once
        keeper.configure({"support": _adapter(v1, digest="sha256:" + "0" * 64, resident=1)})
        await keeper.tidy()
        assert keeper.counts["support"].failures == 1
        assert "digest" in keeper.counts["support"].last_error
        assert await held() == {"support": second}  # the engine keeps what it had
        await keeper.tidy()
        assert keeper.counts["support"].failures == 1
        clock[0] += 31
        await keeper.tidy()
        assert keeper.counts["support"].failures == 2
        # gone from the snapshot: unloaded
        keeper.configure({})
        await keeper.tidy()
        assert await held() == {}


async def test_an_engine_that_does_not_answer_is_tried_again_at_the_next_tidy(
    tmp_path: Path,
) -> None:
    """An engine down (killed, restarting) says nothing of the adapter: its loads are not held
    back for RETRY_FAILED_S, so the engine gets them as soon as it answers."""
    v1 = tiny_model.write_adapter(tmp_path / "v1", tmp_path, seed=1)
    port = free_port()
    table = WorkerTable()
    table.replace([WorkerSpec("e", "llama", "d", "unified", f"http://127.0.0.1:{port}", None)])
    keeper = AdapterKeeper(table, AdapterFiles(tmp_path / "cache"), local=lambda: ["e"],
                           clock=lambda: 0.0)  # fmt: skip
    async with running_sim(*LORA) as described, described.client() as http:
        info = contract.read_server_info((await http.get("/server_info")).json())
    table.described("e", info)  # what it said before it went down
    table.set_engine_state("e", READY)  # its health not yet probed as failing
    keeper.configure({"support": _adapter(v1, resident=1)})
    await keeper.tidy()
    assert keeper.counts["support"].failures == 1
    assert "did not answer" in keeper.counts["support"].last_error
    async with running_sim(*LORA, port=port) as sim, sim.client() as http:
        await keeper.tidy()  # the clock has not moved: no wait for a failure's back-off
        held = contract.read_adapters((await http.get("/v1/models")).json())
        assert held == {"support": str(keeper.files.place(keeper.adapters["support"]))}
    assert keeper.counts["support"].failures == 1
