"""`meridian login`: the device authorization flow against a real OpenID Connect provider, the
person confirming the code in headless Chromium, and the sign-in then used (and renewed) by
the CLI's other commands, as the role the person's groups give."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

from playwright.async_api import Browser

from meridian.procs import stop_child
from tests.kits.browser import browser
from tests.kits.controlplane import start_server
from tests.kits.oidc import PASSWORD, oidc_provider

__all__ = ["browser"]  # the fixture


async def _confirm(browser: Browser, link: str, login: str) -> None:
    """What the person does in the browser: confirm the code, then sign in."""
    page = await browser.new_page()
    await page.goto(link)
    await page.locator("button[type=submit]").first.click()  # "Continue": the code is mine
    await page.locator("input[name=login]").fill(login)
    await page.locator("input[name=password]").fill(PASSWORD)
    await page.locator("button[type=submit]").first.click()
    await page.get_by_text("Sign-in Success").wait_for(timeout=10000)
    await page.close()


async def _meridian(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meridian", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, output.decode()


async def test_the_cli_signs_in_with_the_device_flow_and_acts_as_the_persons_role(
    database_url: str, tmp_path: Path, browser: Browser
) -> None:
    roles = json.dumps({"sre": "operator", "everyone": "viewer"})
    async with oidc_provider({"otto": ["sre", "everyone"]}, ["http://127.0.0.1:1/"]) as provider:
        server = await start_server(
            database_url,
            oidc_issuer=provider.issuer,
            oidc_client_id=provider.client_id,
            oidc_roles=roles,
        )
        try:
            credentials = tmp_path / "credentials.json"
            env = {key: value for key, value in os.environ.items() if key != "MERIDIAN_TOKEN"}
            env |= {"MERIDIAN_URL": server.url, "MERIDIAN_CREDENTIALS": str(credentials),
                    "COLUMNS": "300"}  # fmt: skip
            login = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "meridian", "login", env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            assert login.stdout is not None
            first = (await asyncio.wait_for(login.stdout.readline(), 30)).decode()
            shown = re.search(r"Open (\S+) and confirm the code (\S+)", first)
            assert shown, first
            assert shown.group(2) in shown.group(1)  # the link carries the code
            await _confirm(browser, shown.group(1), "otto")
            rest, _ = await asyncio.wait_for(login.communicate(), 60)
            assert login.returncode == 0, first + rest.decode()
            assert f"Signed in to {server.url} as oidc:otto@example.test, operator" in (
                rest.decode()
            )
            assert credentials.stat().st_mode & 0o077 == 0  # the owner's alone

            # later commands send the sign-in: an operator may list keys, not rotate them
            code, listed = await _meridian("keys", "list", env=env)
            assert code == 0, listed
            code, refused = await _meridian("keys", "rotate", "signing-key", "--control-plane",
                                            env=env)  # fmt: skip
            assert code == 1, refused
            assert "403 forbidden" in refused
            assert "operator" in refused

            # an expired ID token is renewed with the refresh token, unasked
            stored = json.loads(credentials.read_text())
            before = stored[server.url]["id_token"]
            stored[server.url]["expires_at"] = 0
            credentials.write_text(json.dumps(stored))
            code, listed = await _meridian("keys", "list", env=env)
            assert code == 0, listed
            assert json.loads(credentials.read_text())[server.url]["id_token"] != before

            code, out = await _meridian("logout", env=env)
            assert code == 0, out
            code, refused = await _meridian("keys", "list", env=env)
            assert code == 2, refused
            assert "meridian login" in refused
        finally:
            await stop_child(server.process)
