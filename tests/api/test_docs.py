"""Swagger UI (/docs) and ReDoc (/redoc) work without internet access: every asset is local."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from app.api.docs import ASSETS, STATIC_URL
from tests.support import ClientFactory

PAGES = ["/docs", "/redoc"]
KEYS = "docs-key-0123456789"
# Anything that names a host: absolute or protocol-relative URLs.
EXTERNAL = re.compile(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}", re.I)
CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


class _Assets(HTMLParser):
    """The URLs a page loads: script src, link href (stylesheet, icon), img src."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "redoc": "spec-url"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.urls.append(value)


def _asset_urls(html: str) -> list[str]:
    parser = _Assets()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize(
    "settings",
    [{}, {"api_keys": KEYS, "require_auth_for_reads": True}],
    ids=["open-dev-mode", "reads-need-a-key"],
)
def test_doc_pages_load_only_local_assets(
    make_client: ClientFactory, page: str, settings: dict[str, object]
) -> None:
    """No external host anywhere in the page, and every asset it loads answers 200, without a
    key even when reads need one (the pages and the schema are public, like /openapi.json)."""
    client = make_client(**settings)
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert EXTERNAL.findall(html) == []
    assert "fonts.googleapis" not in html
    urls = _asset_urls(html)
    assert "/openapi.json" in urls or "'/openapi.json'" in html
    script_and_styles = [url for url in urls if url.startswith(STATIC_URL)]
    expected = {"/docs": 3, "/redoc": 2}[page]  # js + css + favicon; js + favicon
    assert len(script_and_styles) == expected, urls
    for url in [*urls, "/openapi.json"]:
        assert url.startswith("/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 0, url
        suffix = url[url.rfind(".") :]
        if suffix in CONTENT_TYPES:
            assert CONTENT_TYPES[suffix] in asset.headers["content-type"], url


def test_swagger_ui_does_not_call_the_public_validator(make_client: ClientFactory) -> None:
    html = make_client().get("/docs").text
    assert re.search(r"""["']?validatorUrl["']?\s*:\s*null""", html)


def test_docs_assets_contain_no_web_font_or_cdn_loader(make_client: ClientFactory) -> None:
    """ReDoc's standalone bundle would pull Google Fonts only through the page's <link>; the
    shipped bundles must not load fonts or scripts from a CDN themselves."""
    client = make_client()
    for name in ASSETS:
        body = client.get(f"{STATIC_URL}/{name}").content
        assert b"fonts.googleapis.com" not in body, name
        assert b"cdn.jsdelivr.net" not in body, name
        assert b"unpkg.com" not in body, name


def test_unknown_asset_is_a_404_problem(make_client: ClientFactory) -> None:
    response = make_client().get(f"{STATIC_URL}/nope.js")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
