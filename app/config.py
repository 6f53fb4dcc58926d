"""Service settings, read from the environment (prefix ``CAPPLAN_``) or a ``.env`` file."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_ORIGIN = re.compile(
    r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$"
)


class Settings(BaseSettings):
    """Every setting of the service; see docs/configuration.md for the environment variables."""

    model_config = SettingsConfigDict(env_prefix="CAPPLAN_", env_file=".env", extra="ignore")

    data_dir: Path = Field(
        default=PROJECT_ROOT / "data", description="Directory of the default SQLite database."
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default: SQLite file `<data_dir>/capplan.db`.",
    )
    host: str = Field(default="127.0.0.1", description="Address `serve` binds to.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port `serve` binds to.")
    workers: int = Field(default=1, ge=1, le=64, description="Worker processes of `serve`.")
    api_keys: SecretStr = Field(
        default=SecretStr(""),
        description="Comma-separated API keys for writes; empty: open dev mode.",
    )
    require_auth_for_reads: bool = Field(
        default=False, description="Require an API key for reads too."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO")
    max_request_bytes: int = Field(
        default=1_048_576, gt=0, description="Largest request body accepted (413 above)."
    )
    max_import_bytes: int = Field(
        default=104_857_600,
        gt=0,
        description="Largest ONNX upload accepted by /v1/models/import/onnx (413 above).",
    )
    catalog_dir: Path = Field(
        default=PROJECT_ROOT / "hardware_catalog", description="Hardware catalog directory."
    )
    ssl_certfile: Path | None = Field(
        default=None, description="TLS certificate for `serve` (admission webhooks need HTTPS)."
    )
    ssl_keyfile: Path | None = Field(default=None, description="TLS private key for `serve`.")
    max_in_flight: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Requests admitted into the application at once per worker process (the "
        "probes /healthz, /readyz, /metrics and the admission webhook always are); the others "
        "wait, costing almost nothing, for at most CAPPLAN_DB_QUEUE_TIMEOUT_S, then get 503 "
        "with Retry-After.",
    )
    db_pool_size: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Database connections per worker process, and so the number of requests "
        "that work on the database at once (the others queue without holding a connection).",
    )
    db_queue_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="How long a request may wait for a database slot before it is answered 503 "
        "with Retry-After (load shedding).",
    )
    db_connect_timeout_s: int = Field(
        default=2,
        ge=1,
        le=60,
        description="PostgreSQL connect timeout in seconds (libpq `connect_timeout`).",
    )
    db_statement_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="PostgreSQL `statement_timeout`: the server cancels longer statements.",
    )
    db_call_timeout_s: float = Field(
        default=8.0,
        gt=0,
        le=600,
        description="Client-side limit on one request's database work (a frozen or partitioned "
        "database answers nothing, so only this ends the wait); 503 after it.",
    )
    compute_slots: int = Field(
        default=2,
        ge=1,
        le=256,
        description="CPU-heavy computations (estimates, recommendations, MIG fits and plans) "
        "run at once per worker process, outside the database slots; the others wait for at "
        "most CAPPLAN_COMPUTE_QUEUE_TIMEOUT_S, then get 503 compute-busy with Retry-After.",
    )
    compute_queue_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="How long a request may wait for a compute slot before it is shed (503).",
    )
    compute_timeout_s: float = Field(
        default=8.0,
        gt=0,
        le=600,
        description="Deadline of one request's computation: past it the computation is "
        "stopped at its next checkpoint, its slot released, and the request answered 422 "
        "/problems/too-expensive (no Retry-After: the same request would be stopped again).",
    )
    max_work_units: int = Field(
        default=2_000_000,
        ge=1,
        description="Work budget of one request, checked before computing, in work units of "
        "about 0.5 us of CPU (a recommendation: graph layers x devices x precisions x batch "
        "sizes + 10 x executed layers x precisions x batch sizes; see docs/configuration.md, "
        "Work budgets); over it the request is answered 422 /problems/too-expensive naming "
        "what to reduce.",
    )
    admission_timeout_s: float = Field(
        default=0.8,
        gt=0,
        le=30,
        description="Limit on an admission review's database work; past it the review is "
        "answered by CAPPLAN_ADMISSION_FAILURE_POLICY (Kubernetes' own webhook timeout is longer).",
    )
    cache_staleness_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How long after a write through another worker process or replica cached "
        "admission decisions and MIG fits may still reflect the old data (each process re-reads "
        "a digest of the planning data at most this often; its own writes show at once).",
    )
    cors_origins: str = Field(
        default="",
        description="Comma-separated origins (`https://planner.example.com`, or `*`) whose "
        "browser pages may call the API (CORS); empty: CORS off, no CORS headers.",
    )
    admission_failure_policy: Literal["deny", "allow"] = Field(
        default="deny",
        description="Admission answer when a review cannot be evaluated (allow adds a warning).",
    )

    max_url_bytes: int = Field(
        default=8192,
        ge=256,
        le=1_048_576,
        description="Longest request target (path and query) accepted; longer is a 414, "
        "answered by the HTTP protocol before routing and authentication.",
    )
    max_header_bytes: int = Field(
        default=32768,
        ge=1024,
        le=16_777_216,
        description="Largest header section of a request (every header line); larger is a "
        "431, answered by the HTTP protocol before routing and authentication.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Time a connection has to deliver a complete request head, from its first "
        "byte (or from the connection's start); past it the client gets 408 and the "
        "connection is closed (a slowloris client cannot hold connections open).",
    )

    max_concurrent_imports: int = Field(
        default=2,
        ge=1,
        le=64,
        description="ONNX imports (/v1/models/import/onnx) in progress at once per worker "
        "process, from the first byte of their upload; the others wait (before their upload is "
        "read) for at most CAPPLAN_IMPORT_QUEUE_TIMEOUT_S, then get 503 with Retry-After.",
    )
    import_memory_bytes: int = Field(
        default=293_601_280,
        ge=1,
        description="Memory that ONNX imports in progress may use at once per worker process "
        "(default 280 MiB: one pod of the deploy kit, 512 MiB, idles at about 150 MiB). Each "
        "import reserves 2.75 times its upload's size, its measured peak through HTTP "
        "(benchmarks/import_memory.py), before the upload is read; an upload that needs more "
        "than all of it is a 413.",
    )
    import_queue_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="How long an ONNX import waits for CAPPLAN_MAX_CONCURRENT_IMPORTS or "
        "CAPPLAN_IMPORT_MEMORY_BYTES before it is answered 503 with Retry-After.",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        for origin in (part.strip() for part in value.split(",")):
            if origin and origin != "*" and not _ORIGIN.match(origin):
                raise ValueError(
                    f"CAPPLAN_CORS_ORIGINS: {origin!r} is not an origin: scheme://host[:port] "
                    "(http or https, no path, no trailing slash), or *"
                )
        return value

    @property
    def cors_origin_list(self) -> tuple[str, ...]:
        """Origins allowed to call the API from a browser (empty: CORS off)."""
        return tuple(part.strip() for part in self.cors_origins.split(",") if part.strip())

    @property
    def resolved_database_url(self) -> str:
        """The database URL in force (the SQLite default when none is set)."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'capplan.db'}"

    @property
    def api_key_list(self) -> tuple[str, ...]:
        """Configured API keys (never log these)."""
        raw = self.api_keys.get_secret_value()
        return tuple(key.strip() for key in raw.split(",") if key.strip())


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (cached; tests build their own ``Settings``)."""
    return Settings()
