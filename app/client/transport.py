"""The Capacity Planner API over httpx, answers as plain JSON (no pydantic, no server code).

``capplan`` runs on this alone, so the client package (``client/pyproject.toml``) needs only
httpx; :class:`app.client.api.CapacityPlannerClient` wraps it with the service's typed schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import httpx

Json = dict[str, Any]
Progress = Callable[[int, int], None]  # (bytes sent, total bytes)


class ApiError(Exception):
    """A 4xx/5xx answer; ``problem`` is the RFC 9457 body (or a stand-in for non-JSON ones)."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        super().__init__(f"{status} {problem.get('title', 'error')}: {self.detail}")

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Invalid fields named by a 400/422."""
        return list(self.problem.get("errors") or [])


class _ProgressReader:
    """A file-like object that reports how much of it has been read (httpx streams uploads)."""

    def __init__(self, data: bytes, progress: Progress) -> None:
        self.data, self.position, self.progress = data, 0, progress

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else min(len(self.data), self.position + size)
        chunk = self.data[self.position : end]
        self.position = end
        self.progress(self.position, len(self.data))
        return chunk


def _etag(if_match: str | int) -> str:
    return if_match if isinstance(if_match, str) else f'"{if_match}"'


class JsonClient:
    """Every endpoint, answering the decoded JSON body; pass ``http`` to reuse a client."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        if http is None:
            http = httpx.Client(base_url=base_url, timeout=timeout)
        if api_key:
            http.headers["Authorization"] = f"Bearer {api_key}"
        self.http = http

    def __enter__(self) -> JsonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    # -- plumbing

    def send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request; a 4xx/5xx raises :class:`ApiError` with the problem body."""
        response = self.http.request(method, url, **kwargs)
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"title": response.reason_phrase, "detail": response.text[:500]}
            if not isinstance(problem, dict):
                problem = {"detail": str(problem)}
            raise ApiError(response.status_code, problem)
        return response

    def _json(self, method: str, url: str, **kwargs: Any) -> Json:
        body = self.send(method, url, **kwargs).json()
        if not isinstance(body, dict):
            raise ApiError(502, {"title": "Bad Gateway", "detail": f"{url}: not a JSON object"})
        return body

    def get(self, url: str, params: Mapping[str, Any] | None = None) -> Json:
        """GET a JSON object; ``None`` query values are left out."""
        return self._json("GET", url, params=_query(params))

    def text(self, url: str, params: Mapping[str, Any] | None = None) -> str:
        """GET a text body (SVG, Prometheus)."""
        return self.send("GET", url, params=_query(params)).text

    def post(self, url: str, body: Mapping[str, Any]) -> Json:
        """POST a JSON object."""
        return self._json("POST", url, json=dict(body))

    def put(self, url: str, body: Mapping[str, Any], if_match: str | int) -> Json:
        """PUT with If-Match (an ETag or a version)."""
        return self._json("PUT", url, json=dict(body), headers={"If-Match": _etag(if_match)})

    def delete(self, url: str, if_match: str | int) -> None:
        """DELETE with If-Match."""
        self.send("DELETE", url, headers={"If-Match": _etag(if_match)})

    # -- operations the CLI uses (the typed client has every endpoint)

    def ready(self) -> Json:
        """GET /readyz (raises ApiError with 503 when not ready)."""
        return self._json("GET", "/readyz")

    def list_hardware(self, *, kind: str | None = None, limit: int = 500) -> Json:
        """GET /v1/hardware."""
        return self.get("/v1/hardware", {"kind": kind, "limit": limit})

    def get_hardware(self, slug: str) -> Json:
        """GET /v1/hardware/{slug}."""
        return self.get(f"/v1/hardware/{slug}")

    def list_models(
        self, *, family: str | None = None, provenance: str | None = None, limit: int = 500
    ) -> Json:
        """GET /v1/models."""
        return self.get("/v1/models", {"family": family, "provenance": provenance, "limit": limit})

    def get_model(self, slug: str) -> Json:
        """GET /v1/models/{slug}."""
        return self.get(f"/v1/models/{slug}")

    def model_summary(self, slug: str) -> Json:
        """GET /v1/models/{slug}/summary at batch 1."""
        return self.get(f"/v1/models/{slug}/summary")

    def create_model(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/models."""
        return self.post("/v1/models", body)

    def delete_model(self, slug: str, *, if_match: str | int) -> None:
        """DELETE /v1/models/{slug}."""
        self.delete(f"/v1/models/{slug}", if_match)

    def import_hf_config(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/models/import/hf-config."""
        return self.post("/v1/models/import/hf-config", body)

    def import_onnx(
        self,
        source: str | Path | bytes | IO[bytes],
        *,
        slug: str,
        name: str | None = None,
        family: str | None = None,
        description: str | None = None,
        sequence_length: int | None = None,
        lenient: bool = False,
        progress: Progress | None = None,
    ) -> Json:
        """POST /v1/models/import/onnx (multipart); ``progress(sent, total)`` follows the upload."""
        if isinstance(source, str | Path):
            data = Path(source).read_bytes()
            filename = Path(source).name
        elif isinstance(source, bytes):
            data, filename = source, "model.onnx"
        else:
            data, filename = source.read(), "model.onnx"
        upload: Any = _ProgressReader(data, progress) if progress else data
        fields = {
            "slug": slug,
            "name": name,
            "family": family,
            "description": description,
            "sequence_length": sequence_length,
            "lenient": "true" if lenient else None,
        }
        return self._json(
            "POST",
            "/v1/models/import/onnx",
            files={"file": (filename, upload, "application/octet-stream")},
            data={k: str(v) for k, v in fields.items() if v is not None},
        )

    def estimate_memory(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/estimates/memory."""
        return self.post("/v1/estimates/memory", body)

    def recommend_inference(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/recommendations/inference."""
        return self.post("/v1/recommendations/inference", body)

    def roofline_svg(self, model: str, devices: list[str], **query: Any) -> str:
        """GET /v1/recommendations/roofline.svg for a stored model and up to 8 devices."""
        return self.text(
            "/v1/recommendations/roofline.svg",
            {"model": model, "devices": ",".join(devices), **query},
        )

    def mig_fit(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/mig/fit."""
        return self.post("/v1/mig/fit", body)

    def validate_layout(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/mig/layouts/validate."""
        return self.post("/v1/mig/layouts/validate", body)

    def mig_plan(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/mig/plan."""
        return self.post("/v1/mig/plan", body)

    def list_workloads(self, *, limit: int = 500) -> Json:
        """GET /v1/workloads."""
        return self.get("/v1/workloads", {"limit": limit})

    def get_workload(self, slug: str) -> Json:
        """GET /v1/workloads/{slug}."""
        return self.get(f"/v1/workloads/{slug}")

    def admission_check(self, body: Mapping[str, Any]) -> Json:
        """POST /v1/admission/check."""
        return self.post("/v1/admission/check", body)


def _query(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if v is not None}
