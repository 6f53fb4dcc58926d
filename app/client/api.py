"""Typed methods for every endpoint; responses are the service's own pydantic schemas."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel

from app.client.transport import ApiError, JsonClient, Progress
from app.schemas.admission import AdmissionCheckRequest, AdmissionCheckResponse
from app.schemas.estimates import MemoryEstimateRequest, MemoryEstimateResponse, ModelSummary
from app.schemas.hardware import HardwareCreate, HardwareList, HardwareRead, HardwareReplace
from app.schemas.imports import HfConfigImport, ModelImportResponse
from app.schemas.mig import (
    LayoutValidateRequest,
    LayoutValidateResponse,
    MigFitRequest,
    MigFitResponse,
    MigPlanRequest,
    MigPlanResponse,
    MigProfileList,
)
from app.schemas.models import ModelCreate, ModelList, ModelRead, ModelReplace
from app.schemas.recommendations import (
    InferenceRecommendationRequest,
    InferenceRecommendationResponse,
)
from app.schemas.workloads import WorkloadCreate, WorkloadList, WorkloadRead, WorkloadReplace

T = TypeVar("T", bound=BaseModel)
Payload = BaseModel | Mapping[str, Any]

__all__ = ["ApiError", "CapacityPlannerClient", "Progress"]


def _body(payload: Payload) -> Any:
    if isinstance(payload, BaseModel):
        return payload.model_dump(mode="json", exclude_none=True)
    return dict(payload)


class CapacityPlannerClient:
    """A synchronous client; pass ``http`` to reuse a configured ``httpx.Client``."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.raw = JsonClient(base_url, api_key=api_key, timeout=timeout, http=http)
        self.http = self.raw.http

    def __enter__(self) -> CapacityPlannerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.raw.close()

    # -- plumbing

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self.raw.send(method, url, **kwargs)

    def _get(self, url: str, model: type[T], params: Mapping[str, Any] | None = None) -> T:
        return model.model_validate(self._fetch(url, params).json())

    def _text(self, url: str, params: Mapping[str, Any] | None = None) -> str:
        return self._fetch(url, params).text

    def _fetch(self, url: str, params: Mapping[str, Any] | None) -> httpx.Response:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return self._send("GET", url, params=query)

    def _post(self, url: str, model: type[T], payload: Payload) -> T:
        return model.model_validate(self._send("POST", url, json=_body(payload)).json())

    def _put(self, url: str, model: type[T], payload: Payload, if_match: str | int) -> T:
        return model.model_validate(self.raw.put(url, _body(payload), if_match))

    def _delete(self, url: str, if_match: str | int) -> None:
        self.raw.delete(url, if_match)

    # -- operations

    def health(self) -> dict[str, Any]:
        """GET /healthz."""
        body: dict[str, Any] = self._send("GET", "/healthz").json()
        return body

    def ready(self) -> dict[str, Any]:
        """GET /readyz (raises ApiError with 503 when not ready)."""
        body: dict[str, Any] = self._send("GET", "/readyz").json()
        return body

    def metrics(self) -> str:
        """GET /metrics (Prometheus text)."""
        return self._send("GET", "/metrics").text

    # -- hardware

    def list_hardware(
        self,
        *,
        kind: str | None = None,
        vendor: str | None = None,
        family: str | None = None,
        source: str | None = None,
        mig_capable: bool | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> HardwareList:
        """GET /v1/hardware."""
        params = {"kind": kind, "vendor": vendor, "family": family, "source": source,
                  "mig_capable": mig_capable, "limit": limit, "offset": offset}  # fmt: skip
        return self._get("/v1/hardware", HardwareList, params)

    def get_hardware(self, slug: str) -> HardwareRead:
        """GET /v1/hardware/{slug}."""
        return self._get(f"/v1/hardware/{slug}", HardwareRead)

    def create_hardware(self, payload: HardwareCreate | Mapping[str, Any]) -> HardwareRead:
        """POST /v1/hardware."""
        return self._post("/v1/hardware", HardwareRead, payload)

    def replace_hardware(
        self, slug: str, payload: HardwareReplace | Mapping[str, Any], *, if_match: str | int
    ) -> HardwareRead:
        """PUT /v1/hardware/{slug} with If-Match (an ETag or a version)."""
        return self._put(f"/v1/hardware/{slug}", HardwareRead, payload, if_match)

    def delete_hardware(self, slug: str, *, if_match: str | int) -> None:
        """DELETE /v1/hardware/{slug} with If-Match."""
        self._delete(f"/v1/hardware/{slug}", if_match)

    def mig_profiles(self, slug: str) -> MigProfileList:
        """GET /v1/hardware/{slug}/mig-profiles."""
        return self._get(f"/v1/hardware/{slug}/mig-profiles", MigProfileList)

    # -- models

    def list_models(
        self,
        *,
        family: str | None = None,
        provenance: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> ModelList:
        """GET /v1/models."""
        params = {"family": family, "provenance": provenance, "limit": limit, "offset": offset}
        return self._get("/v1/models", ModelList, params)

    def get_model(self, slug: str) -> ModelRead:
        """GET /v1/models/{slug}."""
        return self._get(f"/v1/models/{slug}", ModelRead)

    def create_model(self, payload: ModelCreate | Mapping[str, Any]) -> ModelRead:
        """POST /v1/models."""
        return self._post("/v1/models", ModelRead, payload)

    def replace_model(
        self, slug: str, payload: ModelReplace | Mapping[str, Any], *, if_match: str | int
    ) -> ModelRead:
        """PUT /v1/models/{slug} with If-Match."""
        return self._put(f"/v1/models/{slug}", ModelRead, payload, if_match)

    def delete_model(self, slug: str, *, if_match: str | int) -> None:
        """DELETE /v1/models/{slug} with If-Match."""
        self._delete(f"/v1/models/{slug}", if_match)

    def model_summary(
        self,
        slug: str,
        *,
        batch_size: int = 1,
        sequence_length: int | None = None,
        image_size: int | None = None,
        precision: str = "fp32",
    ) -> ModelSummary:
        """GET /v1/models/{slug}/summary."""
        params = {"batch_size": batch_size, "sequence_length": sequence_length,
                  "image_size": image_size, "precision": precision}  # fmt: skip
        return self._get(f"/v1/models/{slug}/summary", ModelSummary, params)

    # -- imports

    def import_hf_config(self, payload: HfConfigImport | Mapping[str, Any]) -> ModelImportResponse:
        """POST /v1/models/import/hf-config: ``{slug, name?, family?, config: {...}}``."""
        return self._post("/v1/models/import/hf-config", ModelImportResponse, payload)

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
    ) -> ModelImportResponse:
        """POST /v1/models/import/onnx (multipart); ``progress(sent, total)`` follows the upload."""
        answer = self.raw.import_onnx(
            source,
            slug=slug,
            name=name,
            family=family,
            description=description,
            sequence_length=sequence_length,
            lenient=lenient,
            progress=progress,
        )
        return ModelImportResponse.model_validate(answer)

    # -- estimates

    def estimate_memory(
        self, payload: MemoryEstimateRequest | Mapping[str, Any]
    ) -> MemoryEstimateResponse:
        """POST /v1/estimates/memory."""
        return self._post("/v1/estimates/memory", MemoryEstimateResponse, payload)

    def memory_svg(self, **query: Any) -> str:
        """GET /v1/estimates/memory.svg: the query of ``GET /v1/estimates/memory`` as a chart."""
        return self._text("/v1/estimates/memory.svg", query)

    # -- recommendations

    def recommend_inference(
        self, payload: InferenceRecommendationRequest | Mapping[str, Any]
    ) -> InferenceRecommendationResponse:
        """POST /v1/recommendations/inference."""
        return self._post("/v1/recommendations/inference", InferenceRecommendationResponse, payload)

    def roofline_svg(self, model: str, devices: list[str], **query: Any) -> str:
        """GET /v1/recommendations/roofline.svg for a stored model and up to 8 devices."""
        params = {"model": model, "devices": ",".join(devices), **query}
        return self._text("/v1/recommendations/roofline.svg", params)

    # -- MIG

    def mig_fit(self, payload: MigFitRequest | Mapping[str, Any]) -> MigFitResponse:
        """POST /v1/mig/fit."""
        return self._post("/v1/mig/fit", MigFitResponse, payload)

    def validate_layout(
        self, payload: LayoutValidateRequest | Mapping[str, Any]
    ) -> LayoutValidateResponse:
        """POST /v1/mig/layouts/validate."""
        return self._post("/v1/mig/layouts/validate", LayoutValidateResponse, payload)

    def mig_plan(self, payload: MigPlanRequest | Mapping[str, Any]) -> MigPlanResponse:
        """POST /v1/mig/plan."""
        return self._post("/v1/mig/plan", MigPlanResponse, payload)

    # -- workloads

    def list_workloads(
        self,
        *,
        model: str | None = None,
        mode: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> WorkloadList:
        """GET /v1/workloads."""
        params = {"model": model, "mode": mode, "limit": limit, "offset": offset}
        return self._get("/v1/workloads", WorkloadList, params)

    def get_workload(self, slug: str) -> WorkloadRead:
        """GET /v1/workloads/{slug}."""
        return self._get(f"/v1/workloads/{slug}", WorkloadRead)

    def create_workload(self, payload: WorkloadCreate | Mapping[str, Any]) -> WorkloadRead:
        """POST /v1/workloads."""
        return self._post("/v1/workloads", WorkloadRead, payload)

    def replace_workload(
        self, slug: str, payload: WorkloadReplace | Mapping[str, Any], *, if_match: str | int
    ) -> WorkloadRead:
        """PUT /v1/workloads/{slug} with If-Match."""
        return self._put(f"/v1/workloads/{slug}", WorkloadRead, payload, if_match)

    def delete_workload(self, slug: str, *, if_match: str | int) -> None:
        """DELETE /v1/workloads/{slug} with If-Match."""
        self._delete(f"/v1/workloads/{slug}", if_match)

    def workload_memory(self, slug: str) -> MemoryEstimateResponse:
        """GET /v1/workloads/{slug}/memory."""
        return self._get(f"/v1/workloads/{slug}/memory", MemoryEstimateResponse)

    # -- admission

    def admission_check(
        self, payload: AdmissionCheckRequest | Mapping[str, Any]
    ) -> AdmissionCheckResponse:
        """POST /v1/admission/check."""
        return self._post("/v1/admission/check", AdmissionCheckResponse, payload)

    def admission_review(self, review: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/admission/pods: an AdmissionReview in, an AdmissionReview out."""
        body: dict[str, Any] = self._send("POST", "/v1/admission/pods", json=dict(review)).json()
        return body
