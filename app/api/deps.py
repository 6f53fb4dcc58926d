"""Dependencies: settings, database session, API-key auth, If-Match."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from app.api.compute import Compute
from app.api.database import Database
from app.config import Settings
from app.services.concurrency import IfMatch

logger = logging.getLogger("app.auth")


# Dependencies that do no blocking I/O are `async def`: FastAPI runs sync dependencies in a
# worker thread, and those hops (about 20 per request) dominated request latency.


async def get_settings_dep(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_database(request: Request) -> Database:
    """The app's database gateway: handlers pass it a function of a session to run.

    No handler gets a session of its own: sessions live and die inside the worker thread that
    uses them (see app.api.database), so no connection is ever held across an await.
    """
    database: Database = request.app.state.database
    return database


DatabaseDep = Annotated[Database, Depends(get_database)]


async def get_compute(request: Request) -> Compute:
    """The app's runner of CPU-heavy work (app.api.compute): outside the database slots,
    bounded, and stopped at its deadline or when the client disconnects."""
    compute: Compute = request.app.state.compute
    return compute


ComputeDep = Annotated[Compute, Depends(get_compute)]

_bearer = HTTPBearer(
    auto_error=False, description="API key as a bearer token: `Authorization: Bearer <key>`."
)
_api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="API key in the `X-API-Key` header."
)


def _key_matches(candidate: str, keys: tuple[str, ...]) -> bool:
    """Constant-time comparison against every configured key (no early exit)."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(candidate.encode(), key.encode())
    return matched


def _authenticate(
    settings: Settings,
    bearer: HTTPAuthorizationCredentials | None,
    api_key: str | None,
) -> None:
    keys = settings.api_key_list
    if not keys:
        return  # open dev mode, logged once at start-up
    candidate = bearer.credentials if bearer is not None else api_key
    if not candidate:
        raise HTTPException(
            status_code=401,
            detail="this endpoint needs an API key: send 'Authorization: Bearer <key>' "
            "or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": 'Bearer realm="capacity-planner"'},
        )
    if not _key_matches(candidate, keys):
        logger.warning("rejected API key")  # never log the key itself
        raise HTTPException(status_code=403, detail="the API key is not accepted")


async def require_writer(
    settings: SettingsDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key_header)],
) -> None:
    """Writes need a valid key whenever keys are configured."""
    _authenticate(settings, bearer, api_key)


async def require_reader(
    settings: SettingsDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key_header)],
) -> None:
    """Reads are open unless CAPPLAN_REQUIRE_AUTH_FOR_READS is set."""
    if settings.require_auth_for_reads:
        _authenticate(settings, bearer, api_key)


async def get_if_match(
    if_match: Annotated[
        str | None,
        Header(
            alias="If-Match",
            description='ETag from a previous GET (e.g. `"3"`), or `*`; required for PUT/DELETE.',
        ),
    ] = None,
) -> IfMatch | None:
    """The parsed If-Match header."""
    return IfMatch.parse(if_match)


IfMatchDep = Annotated[IfMatch | None, Depends(get_if_match)]
