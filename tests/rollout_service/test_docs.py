"""`/docs` and `/redoc` render with no network: every asset comes from the gateway itself."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.rollout_service.test_board import Browser


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "chromium-profile")
    yield b
    b.close()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_nothing_from_elsewhere(gateway, page):
    html = httpx.get(gateway.url + page).text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""", html)
    urls = [u for pair in urls for u in pair if u]
    assert urls and all(u.startswith("/") for u in urls), urls  # no CDN, no fonts from elsewhere
    for u in urls:
        if u.startswith("/docs-assets/"):
            r = httpx.get(gateway.url + u)
            assert r.status_code == 200 and len(r.content) > 1000, u


def test_swagger_ui_renders_every_operation_in_a_browser(gateway, browser):
    browser.open(gateway.url + "/docs")
    n = browser.wait("return document.querySelectorAll('.opblock').length", timeout=60, what="operations")
    paths = httpx.get(gateway.url + "/openapi.json").json()["paths"]
    assert n == sum(len(ops) for ops in paths.values())


def test_redoc_renders_in_a_browser(gateway, browser):
    browser.open(gateway.url + "/redoc")
    text = browser.wait("const t = document.body.innerText; return t.includes('/v1/batches') && t",
                        timeout=60, what="the API reference")
    assert "rollout-service" in text
