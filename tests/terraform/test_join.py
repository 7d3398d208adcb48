"""`meridian join` when something is wrong: a secret store that refuses the write, a document
that is not what fleet-document renders, no admin token. The operator's whole path, when all
is well, is in test_bootstrap.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.kits.controlplane import ADMIN_TOKEN, Server, run_cli
from tests.kits.push import ADMIN
from tests.terraform.kit import CLOUDS, REGIONS, FakeClouds, fake_clouds, render

STORES: dict[str, dict[str, str]] = {
    "us-east": {"kind": "aws-secretsmanager", "region": "us-east-1",
                "secret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:bt-us-east"},
    "eu-west": {"kind": "gcp-secret-manager", "secret": "projects/p/secrets/bt-eu-west"},
    "us-west": {"kind": "azure-key-vault", "vault": "meridian-kv", "secret": "bt-us-west"},
}  # fmt: skip


_RENDERED: list[str] = []  # rendered once: terraform takes seconds


async def _document(workdir: Path, url: str) -> dict[str, Any]:
    if not _RENDERED:
        regions = [{**r, "bootstrap_token_store": STORES[r["name"]]} for r in REGIONS]
        out = await render(workdir, "fleet-document", {"clouds": CLOUDS, "regions": regions})
        _RENDERED.append(out["join"])
    document: dict[str, Any] = json.loads(_RENDERED[0])
    document["api_url"] = url  # each test's own control plane
    return document


async def _prepared(tmp_path: Path, server: Server) -> tuple[FakeClouds, Path]:
    """The clouds' CLIs, and a join document for `server` in a file."""
    path = tmp_path / "join.json"
    path.write_text(json.dumps(await _document(tmp_path / "tf", server.url)))
    return fake_clouds(tmp_path), path


async def _state(url: str) -> tuple[list[str], list[str]]:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as http:
        regions = (await http.get("/v1/regions")).json()["items"]
        tokens = (await http.get("/v1/bootstrap-tokens")).json()["items"]
    return sorted(r["name"] for r in regions), sorted(t["region"] for t in tokens)


async def test_a_store_that_refuses_keeps_no_token_and_the_others_get_theirs(
    tmp_path: Path, server: Server
) -> None:
    clouds, path = await _prepared(tmp_path, server)
    env = clouds.env(MERIDIAN_TOKEN=ADMIN_TOKEN, FAKE_CLOUD_FAIL="azure", COLUMNS="200")

    code, said = await run_cli("join", "-f", str(path), env=env)

    assert code == 1, said
    assert "1 of 3 pool(s) got no token" in said
    assert "permission denied on meridian-kv/bt-us-west" in said
    assert "Traceback" not in said
    # us-west's token was taken back: a token no machine can read is only a risk
    assert await _state(server.url) == (["eu-west", "us-east", "us-west"], ["eu-west", "us-east"])
    assert len(list(clouds.store.glob("aws-*"))) == len(list(clouds.store.glob("gcp-*"))) == 1
    assert not list(clouds.store.glob("azure-*"))


async def test_a_dry_run_shows_the_changes_and_makes_no_token(
    tmp_path: Path, server: Server
) -> None:
    clouds, path = await _prepared(tmp_path, server)
    env = clouds.env(MERIDIAN_TOKEN=ADMIN_TOKEN, COLUMNS="200")

    code, said = await run_cli("join", "-f", str(path), "--dry-run", env=env)

    assert code == 0, said
    assert "+ region eu-west" in said
    assert "would change" in said
    assert await _state(server.url) == ([], [])
    assert clouds.calls() == ""


BAD: list[tuple[str, Any, str]] = [
    ("not JSON", "regions:\n  - us-east\n", "is not JSON"),
    ("a pool of no region", lambda d: d["pools"].append(
        {"region": "ap-south", "bootstrap_token_store": STORES["us-east"]}),
     "pools of regions the fleet does not declare: ap-south"),
    ("an unknown store", lambda d: d["pools"][0]["bootstrap_token_store"].update(kind="vault"),
     "pools.0.bootstrap_token_store: Input tag 'vault'"),
    ("an AWS store without its region", lambda d: d["pools"][0]["bootstrap_token_store"].update(
        region=None), "pools.0.bootstrap_token_store.aws-secretsmanager.region: Field required"),
    ("tokens that outlive the control plane's limit", lambda d: d.update(
        token_lifetime_s=90 * 86400), "token_lifetime_s: Input should be less than or equal"),
    ("no admin token", lambda d: d.update(admin_token_store=None),
     "give --token or set MERIDIAN_TOKEN"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "change", "message"), BAD, ids=[b[0] for b in BAD])
async def test_a_bad_document_is_refused_before_anything_changes(
    tmp_path: Path, server: Server, case: str, change: Any, message: str
) -> None:
    clouds = fake_clouds(tmp_path)
    path = tmp_path / "join.json"
    if isinstance(change, str):
        path.write_text(change)
    else:
        document = await _document(tmp_path / "tf", server.url)
        change(document)
        path.write_text(json.dumps(document))

    code, said = await run_cli("join", "-f", str(path), env=clouds.env(MERIDIAN_TOKEN="",
                                                                       COLUMNS="200"))  # fmt: skip

    assert code == 2, said
    assert message in said
    assert await _state(server.url) == ([], [])
    assert clouds.calls() == ""


async def test_a_document_of_apply_that_is_refused_makes_no_token(
    tmp_path: Path, server: Server
) -> None:
    clouds, path = await _prepared(tmp_path, server)
    serving = tmp_path / "serving.yaml"
    serving.write_text(yaml.safe_dump({
        "apiVersion": "meridian/v1",
        "models": [{"name": "m", "source": "org/m", "context_length": 8192}],
        "deployments": [{"name": "d", "model": "m", "region": "ap-south"}],
    }))  # fmt: skip
    env = clouds.env(MERIDIAN_TOKEN=ADMIN_TOKEN, COLUMNS="200")

    code, said = await run_cli("join", "-f", str(path), "--apply", str(serving), env=env)

    assert code == 1, said
    assert "unknown_reference" in said
    assert "ap-south" in said
    assert await _state(server.url) == (["eu-west", "us-east", "us-west"], [])
    assert clouds.calls() == ""


POOLS: list[dict[str, Any]] = [  # what the pool modules' node_pool outputs give, with a cloud
    {"name": "east-h100", "cloud": "aws", "region": "us-east", "gpu_model": "NVIDIA H100",
     "gpus_per_node": 8, "price_per_gpu_hour": 3.9, "spot": False, "min_nodes": 1,
     "max_nodes": 4, "group": "us-east-1/meridian-us-east-nodes",
     "bootstrap_token_store": STORES["us-east"]},
    {"name": "east-h100-spot", "cloud": "aws", "region": "us-east", "gpu_model": "NVIDIA H100",
     "gpus_per_node": 8, "price_per_gpu_hour": 1.9, "spot": True, "min_nodes": 0,
     "max_nodes": 8, "group": "us-east-1/meridian-us-east-spot-nodes",
     "bootstrap_token_store": {**STORES["us-east"],
                               "secret": STORES["us-east"]["secret"] + "-spot"}},
]  # fmt: skip


async def test_node_pools_join_with_their_groups_and_a_token_each_scoped_to_the_pool(
    tmp_path: Path, server: Server
) -> None:
    out = await render(tmp_path / "tf", "fleet-document",
                       {"clouds": CLOUDS, "regions": REGIONS, "node_pools": POOLS})  # fmt: skip
    document = json.loads(out["join"])
    document["api_url"] = server.url
    path = tmp_path / "join.json"
    path.write_text(json.dumps(document))
    clouds = fake_clouds(tmp_path)
    env = clouds.env(MERIDIAN_TOKEN=ADMIN_TOKEN, COLUMNS="200")

    code, said = await run_cli("join", "-f", str(path), env=env)

    assert code == 0, said
    assert "+ node-pool east-h100-spot" in said
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=30) as http:
        pools = (await http.get("/v1/node-pools")).json()["items"]
        tokens = (await http.get("/v1/bootstrap-tokens")).json()["items"]
    assert {p["name"]: (p["group"], p["spot"]) for p in pools} == {
        "east-h100": ("us-east-1/meridian-us-east-nodes", False),
        "east-h100-spot": ("us-east-1/meridian-us-east-spot-nodes", True),
    }
    # one token a pool, scoped to it: the machines its group adds join it
    assert sorted((t["region"], t["pool"]) for t in tokens) == [
        ("us-east", "east-h100"), ("us-east", "east-h100-spot")]  # fmt: skip
    assert len(list(clouds.store.glob("aws-*"))) == 2  # each in its own store

    # two pools writing one store would overwrite each other's token: refused at once
    document["pools"][1]["bootstrap_token_store"] = document["pools"][0]["bootstrap_token_store"]
    path.write_text(json.dumps(document))
    code, said = await run_cli("join", "-f", str(path), env=env)
    assert code == 2, said
    assert "two pools name the same token store" in said
