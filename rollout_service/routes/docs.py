"""`/docs` (Swagger UI) and `/redoc`, served with no network: their scripts and styles come
from the `fastapi-offline` package's static files, mounted under `/docs-assets`, instead of
a CDN. We use only those files; the pages are FastAPI's own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def assets_dir() -> Path:
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("the API docs need the `fastapi-offline` package (pip install 'rollout-service[server]')")
    return Path(spec.origin).parent / "static"


def install(app: FastAPI) -> None:
    """Serve the docs pages; the app must be created with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=title,
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png",
                                   oauth2_redirect_url="/docs/oauth2-redirect")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=title, redoc_js_url=f"{ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS}/favicon.png", with_google_fonts=False)
