"""The perimeter's security headers on responses that set headers of their own (app/guard.py Perimeter),
through the real middleware around a small Starlette app."""

from __future__ import annotations

import httpx
import pytest
from dygo.app.guard import HostRule, Perimeter
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route


def _cached(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok", headers={"Cache-Control": "public, max-age=86400", "X-Frame-Options": "SAMEORIGIN"})


def _client() -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/api/v1/cached", _cached), Route("/open/cached", _cached)])
    guarded = Perimeter(app, HostRule("127.0.0.1", ()))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url="http://127.0.0.1")


@pytest.mark.anyio
async def test_private_response_gets_no_store_in_place_of_its_own_cache_control() -> None:
    async with _client() as client:
        reply = await client.get("/api/v1/cached")
    assert reply.status_code == 200
    assert reply.headers.get_list("cache-control") == ["no-store"]
    assert reply.headers["x-frame-options"] == "SAMEORIGIN"  # other headers the app set are its own


@pytest.mark.anyio
async def test_public_response_keeps_its_own_cache_control() -> None:
    async with _client() as client:
        reply = await client.get("/open/cached")
    assert reply.headers.get_list("cache-control") == ["public, max-age=86400"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
