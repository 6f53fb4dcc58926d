"""/v1/admission: Kubernetes admission webhook and the simple check form."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request

from app.api.deps import DatabaseDep, SettingsDep, require_reader
from app.api.errors import problem_responses
from app.schemas.admission import AdmissionCheckRequest, AdmissionCheckResponse
from app.services import admission as service

router = APIRouter(
    prefix="/v1/admission", tags=["admission"], dependencies=[Depends(require_reader)]
)

REVIEW_EXAMPLE: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "chat",
                "annotations": {
                    "capacity-planner.io/workload": "chat-serving",
                    "capacity-planner.io/gpu": "nvidia-a100-80gb-sxm",
                },
            },
            "spec": {
                "containers": [
                    {
                        "name": "server",
                        "image": "chat:1",
                        "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}},
                    }
                ]
            },
        },
    },
}


@router.post(
    "/pods",
    summary="Kubernetes ValidatingWebhook for Pods",
    # The raw body is parsed by the handler so that malformed reviews still get an
    # AdmissionReview back; the schema is documented here instead.
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "An admission.k8s.io/v1 AdmissionReview for a Pod.",
            "content": {
                "application/json": {"schema": {"type": "object"}, "example": REVIEW_EXAMPLE}
            },
        }
    },
    responses={
        200: {
            "description": "An AdmissionReview with the same uid, allowed, status and warnings.",
            "content": {"application/json": {"example": {"response": {"allowed": True}}}},
        }
    },
)
async def admission_pods(
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Allow the pod when every container's and init container's GPU resource holds its
    workload (`capacity-planner.io/workload` annotation, or inline `model`, `mode`,
    `batch-size`, `precision` annotations) on the GPU named by `capacity-planner.io/gpu`.
    Malformed reviews, unknown workloads and internal errors still get a well-formed
    AdmissionReview, decided by CAPPLAN_ADMISSION_FAILURE_POLICY."""
    try:
        body: Any = json.loads(await request.body())
    except ValueError:
        body = None
    return await db.call(service.review, body, failure_policy=settings.admission_failure_policy)


@router.post(
    "/check",
    response_model=AdmissionCheckResponse,
    responses=problem_responses(400, 401, 403, 404, 413, 422),
    summary="May a workload run on a GPU resource (simple form)",
)
async def admission_check(
    payload: AdmissionCheckRequest, db: DatabaseDep
) -> AdmissionCheckResponse:
    """The webhook's decision for one workload and one resource, for scripts and CI."""
    return await db.call(service.check, payload=payload)
