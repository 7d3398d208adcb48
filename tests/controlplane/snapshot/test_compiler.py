"""The snapshot compiler, tested without a database: the fleet in, one region's state out."""

from __future__ import annotations

import base64
from typing import Any

from controlplane.snapshot import compile_region
from controlplane.snapshot.keys import PUBLISHED, RETIRING, SIGNING, public_key
from controlplane.snapshot.shares import split
from controlplane.snapshot.types import ApiKeyState, KeyState
from tests.kits.fleet_docs import example, state_from


def test_engines_get_their_own_gpus() -> None:
    snapshot = compile_region(state_from(example()), "us-east")
    assert snapshot.revision == 7
    (node,) = snapshot.nodes
    placed = {e.id: e.gpu_indexes for e in node.engines}
    assert placed == {
        "llama-us-east/unified-0": [0],
        "qwen-us-east/prefill-0": [1, 2],  # tp 2, disaggregated: two GPUs each
        "qwen-us-east/decode-0": [3, 4],
    }
    assert len({e.port for e in node.engines}) == 3
    assert snapshot.unplaced == []
    assert [w.url for w in snapshot.workers] == [e.url for e in node.engines]


def test_what_does_not_fit_is_reported() -> None:
    document = example()
    document["deployments"][2]["replicas"] = 3  # llama-eu-west: eu-west-1 has 2 GPUs
    snapshot = compile_region(state_from(document), "eu-west")
    assert len(snapshot.nodes[0].engines) == 2
    (short,) = snapshot.unplaced
    assert (short.deployment, short.role, short.count) == ("llama-eu-west", "unified", 1)


def test_gpu_memory_is_respected() -> None:
    document = example()
    document["nodes"][1]["gpus"] = [{"index": 0, "model": "L4", "memory_gb": 24}]
    document["deployments"].append(
        {
            "name": "qwen-us-west",
            "model": "qwen2.5-32b-instruct",
            "region": "us-west",
            "backend": "sim",
        }
    )
    snapshot = compile_region(state_from(document), "us-west")
    assert [e.deployment for e in snapshot.nodes[0].engines] == ["llama-us-west"]
    assert [u.deployment for u in snapshot.unplaced] == ["qwen-us-west"]


def test_disaggregated_and_external_deployments() -> None:
    document = example()
    document["nodes"][2]["gpus"].append({"index": 2, "model": "H100", "memory_gb": 80})
    document["deployments"][2].update(
        pd_mode="disaggregated", prefill_replicas=1, decode_replicas=2, replicas=None
    )
    document["deployments"].append(
        {
            "name": "qwen-eu-west",
            "model": "qwen2.5-32b-instruct",
            "region": "eu-west",
            "backend": "external",
            "external_urls": ["http://10.1.0.5:30000"],
        }
    )
    snapshot = compile_region(state_from(document), "eu-west")
    roles = sorted(e.role for e in snapshot.nodes[0].engines)
    assert roles == ["decode", "decode", "prefill"]
    external = [w for w in snapshot.workers if w.node is None]
    assert [(w.model, w.url) for w in external] == [
        ("qwen2.5-32b-instruct", "http://10.1.0.5:30000")
    ]
    assert {m.name for m in snapshot.models} == {"llama-3.1-8b-instruct", "qwen2.5-32b-instruct"}


def test_routes_prefer_the_region_then_the_model_then_the_default() -> None:
    state = state_from(example())
    eu = {r.model: r for r in compile_region(state, "eu-west").routes}
    assert eu["llama-3.1-8b-instruct"].source == "llama-eu-west"
    assert eu["llama-3.1-8b-instruct"].slo_ttft_ms == 600
    us = {r.model: r for r in compile_region(state, "us-east").routes}
    assert us["llama-3.1-8b-instruct"].source == "llama-default"
    assert us["qwen2.5-32b-instruct"].policy == "cache_aware"
    document = example()
    document["routing_policies"] = []
    (route,) = compile_region(state_from(document), "us-west").routes
    assert (route.policy, route.source) == ("cost", None)


def test_fallback_chain_carries_reachable_active_peers() -> None:
    document = example()
    chain = compile_region(state_from(document), "us-east").fallback[0]
    assert [(p.region, p.jurisdiction, p.gateway_url) for p in chain.peers] == [
        ("us-west", "us", "http://127.0.0.1:8502"),
        ("eu-west", "eu", "http://127.0.0.1:8503"),
    ]
    assert chain.thresholds.ttft_ms == 800
    document["regions"][1]["state"] = "disabled"
    chain = compile_region(state_from(document), "us-east").fallback[0]
    assert [p.region for p in chain.peers] == ["eu-west"]


def _key(seed: str, state: str = SIGNING, *, opened: bool = True) -> KeyState:
    kid, public = public_key(seed)
    return KeyState(kid=kid, public_key=public, state=state, seed=seed if opened else None)


def test_peers_say_what_they_serve_and_each_region_trusts_only_its_senders() -> None:
    seeds = {r: base64.b64encode(bytes([i]) * 32).decode() for i, r in
             enumerate(("us-east", "us-west", "eu-west"))}  # fmt: skip
    state = state_from(example(), signing_keys={r: [_key(s)] for r, s in seeds.items()})
    east, eu = compile_region(state, "us-east"), compile_region(state, "eu-west")
    peer_models = {p.region: p.models for p in east.fallback[0].peers}
    llama = ["llama-3.1-8b-instruct"]
    assert peer_models == {"us-west": llama, "eu-west": llama}
    assert east.signing_key is not None
    assert east.signing_key.private_key == seeds["us-east"]
    # us-east's rule names us-west and eu-west; us-west's names eu-west; eu-west's, us-east
    assert [t.region for t in eu.trusted] == ["us-east", "us-west"]
    assert [t.region for t in east.trusted] == ["eu-west", "us-west"]
    sent = eu.trusted[0].public_keys
    assert list(sent) == [east.signing_key.key_id]
    assert seeds["us-east"] not in eu.model_dump_json()  # only the public half leaves us-east


def test_a_rotated_key_is_accepted_before_it_signs_and_the_old_one_until_it_is_dropped() -> None:
    old, new = (base64.b64encode(bytes([i]) * 32).decode() for i in (7, 8))
    published = {"us-east": [_key(old), _key(new, PUBLISHED, opened=False)]}
    east, eu = (compile_region(state_from(example(), signing_keys=published), r)
                for r in ("us-east", "eu-west"))  # fmt: skip
    assert east.signing_key is not None
    assert east.signing_key.private_key == old
    assert set(eu.trusted[0].public_keys) == {public_key(old)[0], public_key(new)[0]}
    swapped = {"us-east": [_key(old, RETIRING, opened=False), _key(new)]}
    east, eu = (compile_region(state_from(example(), signing_keys=swapped), r)
                for r in ("us-east", "eu-west"))  # fmt: skip
    assert east.signing_key is not None
    assert east.signing_key.private_key == new
    assert set(eu.trusted[0].public_keys) == {public_key(old)[0], public_key(new)[0]}
    # a seed not opened (the compile of a reader other than the push hub) signs nothing
    unopened = {"us-east": [_key(new, opened=False)]}
    assert (
        compile_region(state_from(example(), signing_keys=unopened), "us-east").signing_key is None
    )


def test_tenants_follow_residency_and_split_quotas_by_capacity() -> None:
    keys = {"k1": ApiKeyState(tenant="eurobank", prefix="mk-1", key_hash="a" * 64, expires_at=None)}
    state = state_from(example(), api_keys=keys)
    by_region = {
        r: {t.name: t for t in compile_region(state, r).tenants}
        for r in ("us-east", "us-west", "eu-west")
    }
    assert set(by_region["eu-west"]) == {"acme", "eurobank"}
    # eurobank is barred from us-east: listed with its jurisdictions and no share, so that
    # its keys are answered 403 there rather than 401
    barred = by_region["us-east"]["eurobank"]
    assert barred.allowed_jurisdictions == ["eu"]
    assert barred.requests_per_minute == barred.tokens_per_minute == 0
    # acme's 6000 rpm follow the GPUs: 5 in us-east, 1 in us-west, 2 in eu-west
    assert [
        by_region[r]["acme"].requests_per_minute for r in ("us-east", "us-west", "eu-west")
    ] == [3750, 750, 1500]
    eurobank = by_region["eu-west"]["eurobank"]
    assert eurobank.requests_per_minute == 1200
    assert [k.key_hash for k in eurobank.api_keys] == ["a" * 64]


def test_a_disabled_region_runs_nothing() -> None:
    document = example()
    document["regions"][0]["state"] = "disabled"
    snapshot = compile_region(state_from(document), "us-east")
    assert snapshot.nodes == []
    assert snapshot.workers == []


def test_the_same_state_compiles_the_same_way() -> None:
    state = state_from(example())
    assert compile_region(state, "us-east") == compile_region(state, "us-east")
    assert (
        compile_region(state, "us-east").model_dump_json()
        == compile_region(state_from(example()), "us-east").model_dump_json()
    )


def _placed(snapshot: Any) -> dict[str, tuple[list[int], int]]:
    return {e.id: (e.gpu_indexes, e.port) for n in snapshot.nodes for e in n.engines}


def _slots(snapshot: Any) -> dict[str, dict[str, Any]]:
    return {
        e.id: {"node": n.name, "gpu_indexes": e.gpu_indexes, "port": e.port}
        for n in snapshot.nodes
        for e in n.engines
    }


def test_engines_keep_their_slots_when_a_deployment_is_added_before_them() -> None:
    document = example()
    document["nodes"][2]["gpus"].append({"index": 2, "model": "H100-SXM-80GB", "memory_gb": 80})
    before = compile_region(state_from(document), "eu-west")
    document["deployments"].append(
        {"name": "a-qwen-eu-west", "model": "qwen2.5-32b-instruct", "region": "eu-west",
         "backend": "sim"}
    )  # fmt: skip
    # Without slots, first fit in name order would give "a-qwen" GPU 0 and port 30000.
    moved = compile_region(state_from(document), "eu-west")
    assert _placed(moved)["a-qwen-eu-west/unified-0"] == ([0], 30000)
    after = compile_region(state_from(document, slots=_slots(before)), "eu-west")
    placed = _placed(after)
    for engine, slot in _placed(before).items():
        assert placed[engine] == slot
    assert placed["a-qwen-eu-west/unified-0"] == ([2], 30002)


def test_a_slot_that_no_longer_fits_is_placed_anew() -> None:
    document = example()
    before = compile_region(state_from(document), "eu-west")
    slots = _slots(before)
    slots["llama-eu-west/unified-1"]["gpu_indexes"] = [7]  # that GPU is gone
    slots["llama-eu-west/unified-0"]["port"] = 31000  # a port is a port: kept
    placed = _placed(compile_region(state_from(document, slots=slots), "eu-west"))
    assert placed["llama-eu-west/unified-0"] == ([0], 31000)
    assert placed["llama-eu-west/unified-1"] == ([1], 30000)  # the lowest free port


def test_a_quota_split_over_regions_never_sums_above_it() -> None:
    """10 a minute over 5, 1 and 2 GPUs: rounding each share up gave 7 + 2 + 3 = 12."""
    document = example()
    next(t for t in document["tenants"] if t["name"] == "acme")["requests_per_minute"] = 10
    state = state_from(document)
    grants = [
        next(t for t in compile_region(state, r).tenants if t.name == "acme")
        for r in ("us-east", "us-west", "eu-west")
    ]
    # whole, for agents that read only those: the largest remainder gets the last one
    assert [g.requests_per_minute for g in grants] == [6, 1, 3]
    # exact, which agents split over their region's agents that are up
    assert [g.requests_per_minute_share for g in grants] == [6.25, 1.25, 2.5]
    for quota in (1, 2, 7, 10, 11, 999, 6001):
        for weights in ({"a": 5, "b": 1, "c": 2}, {"a": 0, "b": 0}, {"a": 3, "b": 3, "c": 3}):
            assert sum(split(quota, weights).values()) == quota


def test_a_spot_pool_never_holds_all_of_a_deployments_engines_while_there_is_room_elsewhere(
) -> None:  # fmt: skip
    """us-west: a spot node first by name, an on-demand one after it. One preemption wave (the
    spot pool taken back) must leave each deployment an engine."""
    document = example()
    h100 = {"model": "H100-SXM-80GB", "memory_gb": 80}
    document["node_pools"].append(
        {"name": "us-west-demand", "cloud": "gcp", "region": "us-west",
         "gpu_model": "H100-SXM-80GB", "gpus_per_node": 2, "price_per_gpu_hour": 4.0,
         "max_nodes": 2})  # fmt: skip
    document["nodes"][1]["gpus"] = [{"index": i, **h100} for i in range(2)]  # us-west-1: spot
    document["nodes"].append({"name": "us-west-2", "region": "us-west", "pool": "us-west-demand",
                              "hostname": "127.0.0.4", "gpus": [{"index": 0, **h100}]})  # fmt: skip

    def where(replicas: int) -> list[str]:
        document["deployments"][1]["replicas"] = replicas  # llama-us-west
        snapshot = compile_region(state_from(document), "us-west")
        return [n.name for i in range(replicas) for n in snapshot.nodes
                for e in n.engines if e.id == f"llama-us-west/unified-{i}"]  # fmt: skip

    assert where(1) == ["us-west-2"]  # its only engine: on demand, though spot is first
    assert where(2) == ["us-west-2", "us-west-1"]  # one on each side: a wave takes one
    assert where(3) == ["us-west-2", "us-west-1", "us-west-1"]  # then wherever it fits
