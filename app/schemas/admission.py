"""Admission contract: the simple check form, and the AdmissionReview the webhook answers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schemas.base import Schema, Slug
from app.schemas.estimates import DefaultUsedRow, WorkloadInput


class AdmissionCheckRequest(Schema):
    """May this workload run on this GPU resource?"""

    workload: WorkloadInput | Slug = Field(
        description="A stored workload's slug, or an inline workload.",
        examples=["chat-serving"],
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


class AdmissionEngineRead(Schema):
    """A workload's serving engine on the resource asked about."""

    engine: str = Field(description="Engine and version modelled.", examples=["vllm 0.19.0"])
    tensor_x_pipeline_gpus: int = Field(
        description="GPUs of its tensor x pipeline group (a container needs that many "
        "nvidia.com/gpu; a group of several cannot be MIG slices).",
        examples=[1],
    )
    required_bytes: int = Field(
        description="Least memory the device must show to CUDA for the engine to start with "
        "min_concurrency sequences of max_model_len [B].",
        examples=[30_000_000_000],
    )
    cuda_visible_bytes: int = Field(
        description="Memory one resource shows to CUDA [B].", examples=[85_030_021_939]
    )
    kv_tokens: int = Field(description="KV tokens the engine holds (0: no start).", examples=[1])
    max_concurrency: float = Field(description="kv_tokens / max_model_len.", examples=[54.17])
    max_model_len: int = Field(description="max_model_len [tokens].", examples=[8192])
    reason: str | None = Field(
        default=None,
        description="Why it does not fit, in the engine's terms.",
        examples=[None],
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
    attention: list[str] = Field(
        description="Attention implementations the estimate used, with why.", examples=[[]]
    )
    defaults_used: list[DefaultUsedRow] = Field(
        description="Every workload option left out and the value the default table gave."
    )
    engine: AdmissionEngineRead | None = Field(
        default=None,
        description="A workload with an `engine`: its figures on the resource; the verdict is "
        "the engine's (it starts, with at least min_concurrency sequences of max_model_len).",
    )


class AdmissionStatus(Schema):
    """Why: the HTTP-like code and a sentence a person can act on."""

    code: int = Field(description="200 when allowed, 403 when denied.", examples=[200])
    message: str = Field(
        description="The decision's reason.",
        examples=["container 'server': chat inference bs 1 bf16 needs 1.2 GiB; ..."],
    )


class AdmissionResponse(Schema):
    """The decision on one review."""

    uid: str = Field(
        description="The review's `request.uid`, echoed (empty when the body had none).",
        examples=["705ab4f5-6393-11e8-b7cc-42010a800002"],
    )
    allowed: bool = Field(description="Whether the pod may be created.", examples=[True])
    status: AdmissionStatus = Field(description="The reason, as a code and a message.")
    warnings: list[str] | None = Field(
        default=None,
        description="Warnings shown to the client (each at most 120 characters); omitted if none.",
        examples=[["chat: headroom 0.4 GiB on nvidia.com/mig-1g.10gb is under 10%"]],
    )
    auditAnnotations: dict[str, str] | None = Field(
        default=None,
        description="Admitted engine pods (vLLM): the expected figures, recorded in the audit "
        "log under the webhook's name: `engine`, `engine-kv-tokens`, "
        "`engine-max-concurrency`, `engine-max-model-len`; omitted otherwise.",
        examples=[{"engine": "vllm 0.19.0", "engine-kv-tokens": "443792"}],
    )


class AdmissionReviewAnswer(Schema):
    """An admission.k8s.io/v1 AdmissionReview carrying the webhook's response."""

    apiVersion: Literal["admission.k8s.io/v1"] = Field(
        description="Always `admission.k8s.io/v1`, the version of the request.",
        examples=["admission.k8s.io/v1"],
    )
    kind: Literal["AdmissionReview"] = Field(
        description="Always `AdmissionReview`.", examples=["AdmissionReview"]
    )
    response: AdmissionResponse = Field(description="The decision, for the review's uid.")
