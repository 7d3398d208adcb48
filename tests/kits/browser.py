"""Debian's Chromium, headless, driven by Playwright: the status page's tests and the people who
sign in at the identity provider."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest_asyncio
from playwright.async_api import Browser, async_playwright

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Browser]:
    assert CHROMIUM, "Chromium is not installed: ./scripts/test installs it"
    async with async_playwright() as p:
        # --no-sandbox: the tests run as root, where Chromium's sandbox cannot start
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        await chromium.close()
