"""The status page's single sign-on in headless Chromium, as each role: the person clicks the
button, signs in on a real OpenID Connect provider's page (tests/kits/oidc), comes back with a
code the page exchanges (PKCE) for an ID token, and sees the fleet as their groups allow; a
tenant admin and a person with no mapped group are told they may not view it."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.async_api import Browser, Page

from meridian.procs import free_port, stop_child
from tests.kits.browser import browser
from tests.kits.controlplane import start_server
from tests.kits.oidc import PASSWORD, oidc_provider

__all__ = ["browser"]  # the fixture
ACCOUNTS = {
    "ada": ["platform-admins"],
    "otto": ["sre"],
    "vera": ["everyone"],
    "tess": ["acme-admins"],
    "mona": ["marketing"],
}
ROLES = {
    "platform-admins": "admin",
    "sre": "operator",
    "everyone": "viewer",
    "acme-admins": "tenant-admin:acme",
}


async def _sign_in(page: Page, url: str, login: str) -> None:
    await page.goto(f"{url}/status")
    await page.locator("#sso").click()
    await page.locator("input[name=login]").fill(login)
    await page.locator("input[name=password]").fill(PASSWORD)
    await page.locator("button[type=submit]").first.click()


async def test_people_sign_in_to_the_status_page_as_their_role(
    database_url: str, tmp_path: Path, browser: Browser
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with oidc_provider(ACCOUNTS, [f"{url}/status"]) as provider:
        server = await start_server(
            database_url, port=str(port), oidc_issuer=provider.issuer,
            oidc_client_id=provider.client_id, oidc_roles=json.dumps(ROLES),
        )  # fmt: skip
        try:
            errors: list[str] = []
            for login, role in (("ada", "admin"), ("otto", "operator"), ("vera", "viewer")):
                context = await browser.new_context()  # a person of their own: no cookies
                page = await context.new_page()
                page.on("pageerror", lambda error: errors.append(str(error)))
                await _sign_in(page, url, login)
                await page.locator("#summary").wait_for(state="visible", timeout=10000)
                shown = page.locator("#whoami")
                await shown.filter(has_text=f"{login}@example.test · {role}").wait_for(
                    timeout=10000
                )
                assert page.url == f"{url}/status", "the code was left in the address"
                assert not errors, errors
                # the session is the tab's: a reload stays signed in; logging out ends it
                await page.reload()
                await page.locator("#summary").wait_for(state="visible", timeout=10000)
                await page.locator("#logout").click()
                await page.locator("#login").wait_for(state="visible", timeout=5000)
                await context.close()

            for login in ("tess", "mona"):  # a tenant admin; a person no group maps
                context = await browser.new_context()
                page = await context.new_page()
                await _sign_in(page, url, login)
                told = page.locator("#login-error")
                await told.filter(has_text="may not view the fleet").wait_for(timeout=10000)
                assert await page.locator("#summary").is_hidden()
                await context.close()
        finally:
            await stop_child(server.process)
