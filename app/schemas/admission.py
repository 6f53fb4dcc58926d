"""Admission contract: the simple check form (the webhook speaks AdmissionReview)."""

from __future__ import annotations

from pydantic import Field

from app.schemas.base import Schema, Slug
from app.schemas.estimates import WorkloadSpec


class AdmissionCheckRequest(Schema):
    """May this workload run on this GPU resource?"""

    workload: WorkloadSpec | Slug = Field(
        description="A stored workload's slug, or an inline workload."
    )
    resource: str = Field(
        max_length=80,
        pattern=r"^nvidia\.com/(gpu|mig-[0-9a-z.+-]+)$",
        description="Kubernetes resource: `nvidia.com/mig-<profile>` or `nvidia.com/gpu`.",
        examples=["nvidia.com/mig-2g.20gb"],
    )
    gpu_model: Slug = Field(
        description="Hardware slug of the GPU.", examples=["nvidia-a100-80gb-sxm"]
    )
    count: int = Field(
        default=1, ge=1, le=64, description="How many of the resource.", examples=[1]
    )


class AdmissionCheckResponse(Schema):
    """The decision with its reason."""

    allowed: bool = Field(description="Whether it fits.", examples=[True])
    message: str = Field(
        description="A sentence a person can act on.",
        examples=["gpt-2 inference bs 1 bf16 needs 1.2 GiB; nvidia.com/mig-1g.10gb gives 9.5 GiB"],
    )
    required_bytes: int = Field(description="Required memory [B].", examples=[1_288_490_188])
    usable_bytes: int = Field(
        description="Usable memory of one resource [B].", examples=[10_200_547_328]
    )
    smallest_fitting_resource: str | None = Field(
        default=None,
        description="Smallest MIG resource of the GPU that fits (null if none).",
        examples=["nvidia.com/mig-1g.10gb"],
    )
    warnings: list[str] = Field(
        description="Warnings (each at most 120 characters).", examples=[[]]
    )
