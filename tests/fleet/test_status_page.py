"""The web status page in a real browser (Debian's Chromium, headless, driven by Playwright) on
a fleet of real processes: log in with a viewer token, see the three regions, see an engine
go down and come back without reloading the page, and see a model alerted while it refuses
most of its requests."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import httpx
from playwright.async_api import Browser, Locator, Page

from tests.kits.browser import browser
from tests.kits.fleet import LLAMA, fleet_of
from tests.kits.push import ADMIN

__all__ = ["browser"]  # the fixture
ENGINE = "llama-us-west/unified-0"
# Where the screenshot goes: the test's directory, or MERIDIAN_SCREENSHOT_DIR when set.
SHOTS = os.environ.get("MERIDIAN_SCREENSHOT_DIR")


async def test_the_status_page_shows_the_fleet_live(
    database_url: str, tmp_path: Path, browser: Browser
) -> None:
    # A slower restart than the default, so that the engine stays down long enough for the
    # assertion to see it down; the page is polled either way.
    env = {"MERIDIAN_AGENT_RESTART_BACKOFF_S": "4"}
    async with fleet_of(database_url, tmp_path, agent_env=env) as fleet:
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            made = await http.post("/v1/principals", json={"name": "wall", "role": "viewer"})
            assert made.status_code == 201, made.text
            viewer = made.json()["token"]
        page = await browser.new_page(viewport={"width": 1500, "height": 1100})
        addresses: list[str] = []
        page.on("request", lambda request: addresses.append(request.url))
        loads: list[str] = []
        page.on("load", lambda p: loads.append(p.url))
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))

        await page.goto(f"{fleet.cp.url}/status")
        await _log_in(page, "not-a-token")
        await page.get_by_text("That token is not valid.").wait_for(timeout=5000)
        await _log_in(page, viewer)
        await page.locator("[data-region]").nth(2).wait_for(timeout=10000)
        regions = page.locator("article[data-region]")
        assert await regions.evaluate_all("els => els.map(e => e.dataset.region)") == [
            "eu-west",
            "us-east",
            "us-west",
        ]
        eu = page.locator('[data-region="eu-west"]')
        assert "jurisdiction eu" in await eu.inner_text()
        await page.locator('[data-region="us-west"][data-health="up"]').wait_for(timeout=10000)
        for region in ("us-east", "us-west", "eu-west"):  # every agent acked its revision
            acks = page.locator(f'[data-region="{region}"] [data-acked="1/1"]')
            await acks.wait_for(timeout=10000)
        # the header's revision is the declared one; each region says which is in force
        assert "declared revision" in await page.locator("#summary").inner_text()
        for card in await regions.all():
            assert "in force: revision" in await card.inner_text()
        await page.locator("#rollout-body .rollout-head").wait_for(timeout=10000)
        assert "null" not in await page.locator("body").inner_text()  # a part left out, as text
        engine = page.locator(f'[data-engine="{ENGINE}"]')
        await page.locator(f'[data-engine="{ENGINE}"][data-state="ready"]').wait_for(timeout=10000)

        async with fleet.client("us-west") as client:  # receipts of what was served
            for _ in range(3):
                await client.chat.completions.create(
                    model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
        receipt = page.locator("#receipts tbody tr", has_text=ENGINE).first
        await receipt.wait_for(timeout=10000)
        assert "us-west" in await receipt.inner_text()
        # the answers us-west's gateway judged (the quality guard), in the quality table
        judged = page.locator(f'#quality tr[data-model="{LLAMA}"][data-quality-region="us-west"]')
        await judged.wait_for(timeout=10000)
        assert "none" in await judged.inner_text()  # nothing flagged, no worker held

        # each tenant's quota with its leases: acme's on every agent, eurobank's in the EU only
        acme = page.locator('#quotas tr[data-tenant="acme"]')
        await acme.filter(has_text="us-west-1").filter(has_text="eu-west-1").wait_for(timeout=10000)
        assert "10000000 req" in await acme.inner_text()
        eurobank = page.locator('#quotas tr[data-tenant="eurobank"]')
        await eurobank.filter(has_text="eu-west-1").wait_for(timeout=10000)
        assert "1200 req" in (text := await eurobank.inner_text())
        assert "us-east-1" not in text
        assert "us-west-1" not in text
        # what acme spent (the ledger's records, priced), and no budget
        spent = page.locator('#spend tr[data-tenant="acme"]')
        await spent.wait_for(timeout=10000)
        assert "none" in await spent.inner_text()

        killed_at = time.monotonic()
        (pid,) = [e["pid"] for e in (await fleet.status("us-west"))["engines"] if e["id"] == ENGINE]
        os.kill(pid, 9)
        await page.locator(f'[data-engine="{ENGINE}"]:not([data-state="ready"])').wait_for(
            timeout=8000
        )
        seen_down_s = time.monotonic() - killed_at
        async with fleet.client("us-west") as client:  # its engine down: a peer answers
            for _ in range(3):
                await client.chat.completions.create(
                    model=LLAMA, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
        shot = Path(SHOTS or tmp_path) / "status-page.png"
        await page.screenshot(path=str(shot), full_page=True)
        print(f"\nthe page showed {ENGINE} down {seen_down_s:.1f} s after kill -9; {shot}")
        assert "exited with -9" in await engine.inner_text()
        await page.locator(f'[data-engine="{ENGINE}"][data-state="ready"]').wait_for(
            timeout=20000
        )  # and back, still without a reload

        # the escalations it caused, drawn with what their numbers are
        label = page.locator("#flows text.label").first
        await label.wait_for(timeout=20000)
        assert re.fullmatch(r"\d+ sent · \d+ a minute now", (await label.text_content() or ""))
        drawn, graph = await label.bounding_box(), await page.locator("#flows").bounding_box()
        assert drawn is not None
        assert graph is not None
        assert graph["x"] <= drawn["x"]
        assert drawn["x"] + drawn["width"] <= graph["x"] + graph["width"]
        await page.screenshot(path=str(Path(SHOTS or tmp_path) / "status-flows.png"),
                              full_page=True)  # fmt: skip

        # a model that refuses most of what it is sent while its engine is ready is alerted
        refusing = page.locator(f'[data-region="us-west"] [data-model="{LLAMA}"][data-alert="1"]')
        refused = asyncio.create_task(_refused_until(fleet.agents["us-west"].url,
                                                     fleet.keys["acme"], refusing))  # fmt: skip
        await refusing.wait_for(timeout=20000)
        sent = await refused
        await page.screenshot(path=str(Path(SHOTS or tmp_path) / "status-refusing.png"),
                              full_page=True)  # fmt: skip
        assert "invalid_request" in await refusing.inner_text()
        assert sent > 0

        assert len(loads) == 1, f"the page was loaded again: {loads}"
        assert not errors, errors
        origin = fleet.cp.url
        assert all(a.startswith(origin) for a in addresses), "the page fetched from elsewhere"
        assert not [a for a in addresses if viewer in a or "token" in a], "a token in a URL"


async def _refused_until(url: str, key: str, shown: Locator) -> int:
    """Requests the gateway refuses (400: a temperature that is not a number), ten a second,
    until the page shows them; how many were sent."""
    body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    sent = 0
    async with httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(200):
            answer = await http.post(f"{url}/v1/chat/completions", json=body)
            assert answer.status_code == 400
            sent += 1
            if await shown.count():
                break
            await asyncio.sleep(0.1)
    return sent


async def _log_in(page: Page, token: str) -> None:
    await page.locator("#token").fill(token)
    await page.get_by_role("button", name="Show the fleet").click()
