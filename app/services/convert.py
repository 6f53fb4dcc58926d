"""Rows and API schemas converted to what the domain works on, once, at the edge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.models import Hardware, MigProfile, Workload, utcnow
from app.db.repositories import HardwareRepository, ModelRepository
from app.domain.cuda_context import cuda_context
from app.domain.engines.choice import EngineChoice
from app.domain.engines.vllm import VllmOptions
from app.domain.graph.analysis import InputDecl
from app.domain.graph.ops import TensorKind
from app.domain.hardware import (
    DeviceKind,
    FrameworkOverhead,
    HardwareSpec,
    PriceKind,
    cublas_workspace,
    pcie_bandwidth_bytes_per_s,
)
from app.domain.mig.layout import (
    MigGeometry,
    MigProfileSpec,
)
from app.domain.peft import LoraConfig, LoraError
from app.domain.peft.qlora import QloraConfig
from app.domain.performance.calibration import CalibrationClass
from app.domain.performance.decoding import DecoderServing, DecodingInputError
from app.domain.performance.recommend import Requirements
from app.domain.performance.request_lengths import (
    LengthDistribution,
    LengthDistributionError,
    LengthKind,
    RequestLengths,
    lognormal_sigma,
)
from app.domain.performance.runtimes import RUNTIME_PROFILES
from app.domain.precision import ComputeCapability, DType, Precision, cannot_run
from app.domain.workload import (
    DeepSpeedBuffers,
    GpuTraits,
    Parallelism,
    Runtime,
    TrainingOptionError,
    TrainingOptions,
    WorkloadInputError,
)
from app.domain.workload import WorkloadSpec as DomainWorkloadSpec
from app.schemas.engine_options import EngineOptions
from app.schemas.estimates import (
    InlineArchitecture,
    LoraSpec,
    OverheadSpec,
    QloraSpec,
    WorkloadInput,
)
from app.schemas.hardware import HardwareBase
from app.schemas.recommendations import CalibrationOverride, InferenceRecommendationRequest
from app.schemas.recommendations.lengths import LengthDistributionSpec
from app.schemas.workloads import (
    WorkloadBase,
    WorkloadOptions,
)
from app.services.errors import InvalidInput, NotFound
from app.services.model_store import StoredCheckpoint, stored_checkpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfileRecord:
    """A MIG profile as plain data: the columns of a stored ``MigProfile`` row."""

    name: str
    memory_mib: int
    compute_slices: int
    sm_count: int | None
    memory_slices: int
    max_instances: int
    placements: list[int]
    unconfirmed: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareRecord:
    """A hardware profile as plain data, with the names and types of the ``Hardware`` row's
    columns: what a client supplies, as it is stored. :func:`hardware_spec` reads a row or a
    record alike, so the calibration scripts get catalog devices without ORM rows."""

    slug: str
    vendor: str
    name: str
    kind: str
    family: str | None
    architecture: str | None
    launch_year: int | None
    memory_bytes: int
    memory_type: str | None
    memory_bandwidth_bytes_per_s: int
    peak_flops_per_s: dict[str, float]
    peak_sparse_flops_per_s: dict[str, float]
    host_link_type: str
    host_link_pcie_generation: int | None
    host_link_pcie_lanes: int | None
    host_link_bandwidth_bytes_per_s: int | None
    gpu_link_type: str | None
    gpu_link_bandwidth_bytes_per_s: int | None
    sm_count: int | None
    compute_capability: str | None
    cuda_visible_memory_bytes: int | None
    cuda_visible_memory_source: str | None
    tdp_watts: float | None
    price_usd_per_hour: float | None
    price_kind: str | None
    price_region: str | None
    price_date: date | None
    price_source: str | None
    cpu: dict[str, Any] | None
    framework_overhead: dict[str, int] | None
    unconfirmed: list[str]
    sources: list[str]
    notes: str | None
    mig_total_compute_slices: int | None
    mig_total_memory_slices: int | None
    mig_max_gpu_instances: int | None
    mig_profiles: tuple[MigProfileRecord, ...]


# The row's columns a record sets (everything but the slug, which a write never changes, and the
# MIG profiles, which are child rows).
_RECORD_COLUMNS = tuple(
    name for name in HardwareRecord.__slots__ if name not in ("slug", "mig_profiles")
)


def hardware_record(slug: str, fields: HardwareBase) -> HardwareRecord:
    """THE mapping of a hardware schema (an API body or a catalog entry) to stored values."""
    mig = fields.mig
    return HardwareRecord(
        slug=slug,
        vendor=fields.vendor,
        name=fields.name,
        kind=fields.kind.value,
        family=fields.family,
        architecture=fields.architecture,
        launch_year=fields.launch_year,
        memory_bytes=fields.memory_bytes,
        memory_type=fields.memory_type,
        memory_bandwidth_bytes_per_s=fields.memory_bandwidth_bytes_per_s,
        peak_flops_per_s={k.value: v for k, v in sorted(fields.peak_flops_per_s.items())},
        peak_sparse_flops_per_s={
            k.value: v for k, v in sorted(fields.peak_sparse_flops_per_s.items())
        },
        host_link_type=fields.host_link.type,
        host_link_pcie_generation=fields.host_link.pcie_generation,
        host_link_pcie_lanes=fields.host_link.pcie_lanes,
        host_link_bandwidth_bytes_per_s=fields.host_link.bandwidth_bytes_per_s,
        gpu_link_type=None if fields.gpu_link is None else fields.gpu_link.type,
        gpu_link_bandwidth_bytes_per_s=(
            None if fields.gpu_link is None else fields.gpu_link.bandwidth_bytes_per_s
        ),
        sm_count=fields.sm_count,
        compute_capability=fields.compute_capability,
        cuda_visible_memory_bytes=fields.cuda_visible_memory_bytes,
        cuda_visible_memory_source=fields.cuda_visible_memory_source,
        tdp_watts=fields.tdp_watts,
        price_usd_per_hour=fields.price_usd_per_hour,
        price_kind=None if fields.price_kind is None else fields.price_kind.value,
        price_region=fields.price_region,
        price_date=fields.price_date,
        price_source=fields.price_source,
        cpu=fields.cpu.model_dump() if fields.cpu else None,
        framework_overhead=(
            fields.framework_overhead.model_dump() if fields.framework_overhead else None
        ),
        unconfirmed=list(fields.unconfirmed),
        sources=list(fields.sources),
        notes=fields.notes,
        mig_total_compute_slices=mig.total_compute_slices if mig else None,
        mig_total_memory_slices=mig.total_memory_slices if mig else None,
        mig_max_gpu_instances=mig.max_gpu_instances if mig else None,
        mig_profiles=tuple(
            MigProfileRecord(
                name=profile.name,
                memory_mib=profile.memory_mib,
                compute_slices=profile.compute_slices,
                sm_count=profile.sm_count,
                memory_slices=profile.memory_slices,
                max_instances=profile.max_instances,
                placements=list(profile.placements),
                unconfirmed=list(profile.unconfirmed),
            )
            for profile in (mig.profiles if mig else [])
        ),
    )


def apply_hardware_fields(target: Hardware, fields: HardwareBase) -> None:
    """Copy every client-supplied field onto the ORM row (MIG profiles replaced whole)."""
    record = hardware_record(target.slug, fields)
    for name in _RECORD_COLUMNS:
        setattr(target, name, getattr(record, name))
    # Update profiles in place by name: (hardware_id, name) stays unique within one flush, and
    # the parent's versioned UPDATE is flushed before any child row is touched.
    existing = {profile.name: profile for profile in target.mig_profiles}
    profiles = []
    for position, profile in enumerate(record.mig_profiles):
        child = existing.get(profile.name) or MigProfile(name=profile.name)
        child.position = position
        child.memory_mib = profile.memory_mib
        child.compute_slices = profile.compute_slices
        child.sm_count = profile.sm_count
        child.memory_slices = profile.memory_slices
        child.max_instances = profile.max_instances
        child.placements = profile.placements
        child.unconfirmed = profile.unconfirmed
        profiles.append(child)
    target.mig_profiles = profiles
    target.updated_at = utcnow()


_OPTIONS = frozenset(WorkloadOptions.model_fields)


def to_spec(fields: WorkloadBase) -> WorkloadInput:
    """The memory-estimate inputs of a workload (422 naming the workload's field when the
    combination is not a valid estimate request)."""
    options = fields.options.model_dump()
    try:
        return WorkloadInput.model_validate(
            {
                "model": fields.model,
                "mode": fields.mode,
                "batch_size": fields.batch_size,
                "sequence_length": fields.sequence_length,
                "image_size": fields.image_size,
                "precision": fields.precision,
                **({"optimizer": fields.optimizer} if fields.optimizer else {}),
                **options,
            }
        )
    except ValidationError as exc:
        raise _invalid_spec(exc) from exc


def _invalid_spec(exc: ValidationError) -> InvalidInput:
    """The first error of a workload's estimate inputs, pointing at the workload's field."""
    first = exc.errors(include_url=False, include_input=False)[0]
    loc = tuple(str(part) for part in first["loc"])
    if loc and loc[0] in _OPTIONS:
        loc = ("options", *loc)
    pointer = "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in loc) or "/"
    return InvalidInput(f"{pointer}: {first['msg']}", pointer=pointer)


def workload_fields(row: Workload) -> dict[str, Any]:
    """The client-supplied fields of a stored workload."""
    return {
        "name": row.name,
        "description": row.description,
        "model": row.model.slug,
        "mode": row.mode,
        "batch_size": row.batch_size,
        "sequence_length": row.sequence_length,
        "image_size": row.image_size,
        "precision": row.precision,
        "optimizer": row.optimizer,
        "hardware": workload_device(row),
        "options": row.options,
    }


def workload_device(row: Workload) -> str | None:
    """A stored workload's device as written: ``slug``, or ``slug/profile`` for one MIG slice
    (None: no hardware). A slice whose slug is no longer the workload's hardware was left by a
    release that does not know slices (it rewrote the hardware only): the whole device then."""
    if row.hardware is None:
        return None
    stored = row.hardware_slice
    if stored is not None and stored.partition("/")[0] == row.hardware.slug:
        return stored
    return row.hardware.slug


def input_decls(inputs: Sequence[Mapping[str, Any]]) -> list[InputDecl]:
    return [
        InputDecl(
            name=spec["name"],
            shape=tuple(spec["shape"]),
            kind=TensorKind.INDEX if spec.get("dtype") == "int64" else TensorKind.FLOAT,
        )
        for spec in inputs
    ]


def bind_dims(
    defaults: Mapping[str, int],
    extra: Mapping[str, int],
    *,
    batch: int,
    sequence_length: int | None,
    image_size: int | None,
) -> dict[str, int]:
    """Symbol bindings: the model's defaults, the request's, then batch, seq and image."""
    bound = {**defaults, **extra, "batch": batch}
    if sequence_length is not None:
        bound["seq"] = sequence_length
    if image_size is not None:
        bound["image"] = image_size
    return dict(sorted(bound.items()))


def hardware_overhead(
    hardware: Hardware | HardwareRecord | None, override: OverheadSpec | None = None
) -> FrameworkOverhead:
    """The framework overhead defaults of a hardware profile (the cuBLAS workspace of its
    architecture), with the profile's own figures and then the request's overrides."""
    values: dict[str, Any] = {}
    if hardware is not None:
        values["workspace_bytes"], values["workspace_source"] = cublas_workspace(
            hardware.architecture
        )
    # The CUDA context from the table of published figures (CUDA 12, lazy loading), by the
    # GPU's compute capability; a profile's or the request's figure replaces it.
    context = cuda_context(compute_capability(hardware) if hardware is not None else None)
    values["cuda_context_bytes"] = context.context_bytes
    values["context_source"] = context.source
    values["context_default"] = context.assumption
    if hardware is not None and hardware.framework_overhead:
        values.update(hardware.framework_overhead)
        if "workspace_bytes" in hardware.framework_overhead:
            values["workspace_source"] = f"workspace per handle and stream from {hardware.slug}"
        if "cuda_context_bytes" in hardware.framework_overhead:
            values["context_source"] = f"CUDA context from the hardware profile {hardware.slug}"
            values["context_default"] = ""
    if override is not None:
        given = override.model_dump(exclude_none=True)
        values.update(given)
        if "workspace_bytes" in given:
            values["workspace_source"] = "workspace per handle and stream, as the request set it"
        if "cuda_context_bytes" in given:
            values["context_source"] = "CUDA context, as the request set it"
            values["context_default"] = ""
    return FrameworkOverhead(**values)


def compute_capability(hardware: Hardware | HardwareRecord) -> ComputeCapability | None:
    """A profile's CUDA compute capability (None: not stated, or not a CUDA device)."""
    text = hardware.compute_capability
    if not text or hardware.kind not in ("gpu", "edge"):
        return None
    try:
        return ComputeCapability.parse(text)
    except ValueError:  # a row written around the schema: treated as unknown
        return None


def hardware_gpu(hardware: Hardware | None) -> GpuTraits | None:
    """What the defaults need of a GPU profile (None without one, or for a CPU/TPU)."""
    if hardware is None or hardware.kind not in ("gpu", "edge"):
        return None
    return GpuTraits(name=hardware.slug, compute_capability=compute_capability(hardware))


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    """A device as a request names it: ``slug`` (the whole device) or ``slug/profile`` (one MIG
    slice: the profile's usable memory; the GPU's overheads, runtime and compute capability)."""

    name: str  # as asked
    row: Hardware  # the device's row (a slice's GPU)
    profile: MigProfileSpec | None = None

    @property
    def memory_bytes(self) -> int:
        """The memory a workload may use: the slice's usable memory, else the device's [B]."""
        return self.row.memory_bytes if self.profile is None else self.profile.memory_bytes

    @property
    def gpu(self) -> GpuTraits | None:
        """What the defaults need of it (None: not a CUDA device)."""
        traits = hardware_gpu(self.row)
        return (
            None
            if traits is None
            else GpuTraits(name=self.name, compute_capability=traits.compute_capability)
        )


def device_target(session: Session, name: str) -> DeviceTarget:
    """The device ``name`` names, ``slug`` or ``slug/profile``: 404 for an unknown slug, a GPU
    without MIG given a profile, or a profile the GPU does not have (naming the valid ones)."""
    slug, _, profile_name = name.partition("/")
    row = HardwareRepository(session).get(slug)
    if row is None:
        raise NotFound(f"hardware profile '{slug}' does not exist; GET /v1/hardware lists them")
    if not profile_name:
        return DeviceTarget(name=slug, row=row)
    if row.mig_total_compute_slices is None:
        raise NotFound(f"'{slug}' does not support MIG, so it has no profile '{profile_name}'")
    geo = geometry(row)
    profile = geo.profile(profile_name)
    if profile is None:
        raise NotFound(
            f"'{slug}' has no MIG profile '{profile_name}'; valid profiles: "
            + ", ".join(p.name for p in geo.profiles)
        )
    return DeviceTarget(name=f"{slug}/{profile.name}", row=row, profile=profile)


def runs_precision(hardware: Hardware, precision: Precision) -> bool:
    """Whether a hardware profile can run ``precision`` (its compute capability and peak table,
    app.domain.precision.cannot_run): a "GPUs that would fit" list offers no others."""
    reason = cannot_run(
        precision,
        compute_capability=compute_capability(hardware),
        peak_dtypes=set(hardware.peak_flops_per_s),
    )
    return reason is None


def split_gpu(payload: Any) -> tuple[str, str | None]:
    """A request's ``gpu`` (``slug`` or ``slug/profile``) and ``profile`` as (slug, profile):
    422 when both name a profile and they differ."""
    slug, _, named = payload.gpu.partition("/")
    if named and payload.profile and payload.profile != named:
        raise InvalidInput(
            f"gpu names profile '{named}' and profile names '{payload.profile}'; give one",
            pointer="/profile",
        )
    return slug, named or payload.profile


def hardware_runtime(hardware: Hardware | None) -> Runtime | None:
    """The runtime a hardware profile implies (None without one)."""
    if hardware is None:
        return None
    return Runtime.CPU if hardware.kind == "cpu" else Runtime.CUDA


# inputs, layers, default bindings, label, a key that changes whenever the graph does, and the
# stored model's pre-quantized checkpoint (None: unquantized, or an inline architecture)
GraphSource = tuple[list[Any], list[Any], dict[str, int], str, str, StoredCheckpoint | None]


def model_graph(
    session: Session, model: str | None, architecture: InlineArchitecture | None
) -> GraphSource:
    """A stored model (by slug; 404 when unknown) or an inline architecture as a graph."""
    if model is not None:
        row = ModelRepository(session).get(model)
        if row is None:
            raise NotFound(f"model '{model}' does not exist; GET /v1/models lists them")
        # id + version + update time: a row deleted and re-created under the same slug differs
        key = f"{row.slug}:{row.id}:{row.version}:{row.updated_at.isoformat()}"
        checkpoint = stored_checkpoint(row)
        return row.inputs, row.layers, row.default_bindings, row.slug, key, checkpoint
    assert architecture is not None  # enforced by the schemas
    inputs = [item.model_dump() for item in architecture.inputs]
    return inputs, architecture.layers, dict(architecture.default_bindings), "inline", "", None


def domain_workload(spec: WorkloadInput, runtime: Runtime | None = None) -> DomainWorkloadSpec:
    """The API's workload as the domain's (None options stay None: the default table decides)."""
    par = spec.parallelism
    try:
        return DomainWorkloadSpec(
            mode=spec.mode,
            batch_size=spec.batch_size,
            micro_batch_size=spec.micro_batch_size,
            sequence_length=spec.sequence_length,
            decoder_sequence_length=spec.decoder_sequence_length,
            image_size=spec.image_size,
            bindings=dict(spec.bindings),
            precision=spec.precision,
            optimizer=spec.optimizer,
            optimizer_impl=spec.optimizer_impl,
            checkpointing=spec.checkpointing,
            parallelism=Parallelism(
                data=par.data,
                tensor=par.tensor,
                pipeline=par.pipeline,
                zero_stage=par.zero_stage,
                gradient_as_bucket_view=par.gradient_as_bucket_view,
                cpu_offload=par.cpu_offload,
                deepspeed=None
                if par.deepspeed is None
                else DeepSpeedBuffers(**par.deepspeed.model_dump()),
            ),
            fp32_grad_buffer=spec.fp32_grad_buffer,
            kv_cache=spec.kv_cache,
            attention=spec.attention,
            logits=spec.logits,
            runtime=runtime,
            lora=domain_lora(spec.lora),
            engine=domain_engine(spec),
            training_options=TrainingOptions(
                optimizer_in_backward=spec.optimizer_in_backward,
                loss_chunks=spec.loss_chunks,
                loss=spec.loss,
                tokens_per_batch=spec.tokens_per_batch,
                keep_gradients=spec.keep_gradients,
                keep_outputs=spec.keep_outputs,
                activation_offload=spec.activation_offload,
                compile=spec.compile,
            ),
        )
    except LoraError as exc:
        raise InvalidInput(str(exc), pointer=exc.pointer) from exc
    except TrainingOptionError as exc:  # the training option that contradicts another
        raise InvalidInput(str(exc), pointer=f"/{exc.field}") from exc
    except WorkloadInputError as exc:
        raise InvalidInput(str(exc)) from exc


def domain_engine(spec: WorkloadInput) -> EngineChoice | None:
    """The workload's serving engine as the domain's choice (None: none). Parallel degrees the
    engine is not given are the workload's (app.schemas.estimates.engine_rule: they agree)."""
    if spec.engine is None:
        return None
    return engine_choice_of(spec.engine, spec.parallelism.tensor, spec.parallelism.pipeline)


def engine_choice_of(engine: EngineOptions, tensor: int, pipeline: int) -> EngineChoice:
    """An engine's options (the request's) on a ``tensor`` x ``pipeline`` group as the domain's
    choice (degrees the engine names win)."""
    return EngineChoice(
        name=engine.name,
        options=VllmOptions(
            max_model_len=engine.max_model_len,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            max_num_seqs=engine.max_num_seqs,
            block_size=engine.block_size,
            dtype=engine.dtype,
            kv_cache_dtype=engine.kv_cache_dtype,
            tensor_parallel_size=engine.tensor_parallel_size or tensor,
            pipeline_parallel_size=engine.pipeline_parallel_size or pipeline,
            enforce_eager=engine.enforce_eager,
        ),
        min_concurrency=engine.min_concurrency or 1,
        quantization=engine.quantization,
        quantization_config=engine.quantization_config,
    )


def domain_lora(spec: LoraSpec | None) -> LoraConfig | None:
    """The API's LoRA option as the domain's."""
    if spec is None:
        return None
    return LoraConfig(
        r=spec.r,
        alpha=spec.alpha,
        target_modules=tuple(spec.target_modules or ()),
        target_regex=spec.target_regex,
        target_kind=spec.target_kind,
        dropout=spec.dropout,
        bias=spec.bias,
        modules_to_save=tuple(spec.modules_to_save),
        use_dora=spec.use_dora,
        merged=spec.merged,
        qlora=domain_qlora(spec.qlora),
    )


def domain_qlora(spec: QloraSpec | None) -> QloraConfig | None:
    """The API's QLoRA base as the domain's."""
    if spec is None:
        return None
    return QloraConfig(
        quant_type=spec.bnb_4bit_quant_type,
        double_quant=spec.bnb_4bit_use_double_quant,
        compute_dtype=DType(spec.bnb_4bit_compute_dtype.value),
        skip_modules=tuple(spec.llm_int8_skip_modules),
        prepare_kbit_training=spec.prepare_model_for_kbit_training,
        use_gradient_checkpointing=spec.use_gradient_checkpointing,
    )


def overhead_sources(
    hardware: Hardware | None, override: OverheadSpec | None = None
) -> dict[str, str]:
    """Where the CUDA context and workspace figures come from: the request, the hardware
    profile or the default."""
    profile = (hardware.framework_overhead or {}) if hardware is not None else {}
    given = override.model_dump(exclude_none=True) if override is not None else {}
    sources = {}
    for key, field_name, default in (
        (
            "cuda_context",
            "cuda_context_bytes",
            "default, "
            + cuda_context(compute_capability(hardware) if hardware is not None else None).source,
        ),
        ("workspace", "workspace_bytes", "default cuBLAS/cuDNN workspace"),
    ):
        if field_name in given:
            sources[key] = "request override"
        elif hardware is not None and field_name in profile:
            sources[key] = f"hardware profile '{hardware.slug}'"
        else:
            sources[key] = default
    return sources


def geometry(row: Hardware | HardwareRecord) -> MigGeometry:
    """The pure MIG geometry of a hardware row (or record)."""
    profiles = sorted(
        (
            MigProfileSpec(
                name=p.name,
                memory_mib=p.memory_mib,
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                placements=tuple(p.placements),
                sm_count=p.sm_count,
            )
            for p in row.mig_profiles
        ),
        key=lambda p: (p.compute_slices, p.memory_mib, p.name),
    )
    return MigGeometry(
        gpu=row.slug,
        total_compute_slices=row.mig_total_compute_slices or 0,
        total_memory_slices=row.mig_total_memory_slices or 0,
        max_gpu_instances=row.mig_max_gpu_instances or 0,
        profiles=tuple(profiles),
    )


def _host_link(row: Hardware | HardwareRecord) -> tuple[float | None, str]:
    if row.kind in (DeviceKind.CPU, DeviceKind.EDGE):
        return None, "none: the host's own memory (no copy)"
    if row.host_link_bandwidth_bytes_per_s:
        return float(row.host_link_bandwidth_bytes_per_s), "catalog host_link.bandwidth"
    gen, lanes = row.host_link_pcie_generation, row.host_link_pcie_lanes
    if gen is not None and lanes is not None:
        bandwidth = pcie_bandwidth_bytes_per_s(gen, lanes)
        if bandwidth is not None:
            return bandwidth, f"theoretical PCIe Gen{gen} x{lanes} per direction"
    return None, "unknown"


def hardware_spec(
    row: Hardware | HardwareRecord,
    *,
    price_usd_per_hour: float | None = None,
    request_price_kind: PriceKind = PriceKind.ON_DEMAND,
) -> HardwareSpec:
    """The ONE domain view of a hardware row, or of a :class:`HardwareRecord` (a catalog entry
    without a database): roofline figures, MIG geometry and framework overheads (a request's
    price replaces the catalog's; it is a price of ``request_price_kind``, with no region or
    date)."""
    link, link_source = _host_link(row)
    price, price_source = row.price_usd_per_hour, "catalog"
    kind = None if row.price_kind is None else PriceKind(row.price_kind)
    region, when = row.price_region, row.price_date
    if price_usd_per_hour is not None:
        price, price_source, kind = price_usd_per_hour, "request", request_price_kind
        region = when = None
    elif price is None:
        price_source = "none in the catalog"
    elif row.price_source:
        price_source = f"catalog: {row.price_source}"
    return HardwareSpec(
        slug=row.slug,
        name=f"{row.vendor} {row.name}",
        kind=DeviceKind(row.kind),
        peak_flops_per_s={DType(k): float(v) for k, v in row.peak_flops_per_s.items()},
        memory_bandwidth_bytes_per_s=float(row.memory_bandwidth_bytes_per_s),
        memory_bytes=row.memory_bytes,
        host_link_bytes_per_s=link,
        host_link_source=link_source,
        gpu_link_bytes_per_s=(
            None
            if row.gpu_link_bandwidth_bytes_per_s is None
            else float(row.gpu_link_bandwidth_bytes_per_s)
        ),
        tdp_watts=row.tdp_watts,
        price_usd_per_hour=price,
        price_source=price_source,
        price_kind=kind,
        price_region=region,
        price_date=when,
        simd=(row.cpu or {}).get("simd"),
        sm_count=row.sm_count,
        compute_capability=compute_capability(row),
        cuda_visible_memory_bytes=row.cuda_visible_memory_bytes,
        cuda_visible_memory_source=row.cuda_visible_memory_source,
        cpu_cores=(row.cpu or {}).get("cores"),
        architecture=row.architecture,
        mig=geometry(row) if row.mig_total_compute_slices is not None else None,
        overhead=hardware_overhead(row),
    )


def calibration_overrides(
    overrides: Mapping[CalibrationClass, CalibrationOverride],
) -> dict[CalibrationClass, dict[str, float]]:
    """A request's calibration overrides as :class:`Calibration` fields in their units (the
    API's microseconds become seconds); fields left out are not overridden."""
    result: dict[CalibrationClass, dict[str, float]] = {}
    for cls, override in overrides.items():
        values = override.model_dump(exclude_none=True)
        for name in ("kernel_launch_overhead", "request_overhead", "host_dispatch"):
            if f"{name}_us" in values:
                values[f"{name}_s"] = values.pop(f"{name}_us") * 1e-6
        result[cls] = values
    return result


def decoder_serving(payload: InferenceRecommendationRequest) -> DecoderServing:
    """The request's decoder lengths, batching and beams (means default to the maxima)."""
    lengths = request_lengths(payload)
    try:
        return DecoderServing(
            prompt_tokens_max=payload.prompt_tokens,
            prompt_tokens_mean=(
                lengths.prompt.mean_tokens_rounded()
                if lengths is not None
                else payload.prompt_tokens_mean or payload.prompt_tokens
            ),
            generated_tokens_max=payload.generated_tokens,
            generated_tokens_mean=(
                lengths.generated.mean_tokens_rounded()
                if lengths is not None
                else payload.generated_tokens_mean or payload.generated_tokens
            ),
            batching=payload.batching,
            beam_width=payload.beam_width,
            kv_block_tokens=payload.kv_block_tokens,
            prompt_shared_by_beams=payload.beams_share_prompt,
        )
    except DecodingInputError as exc:
        raise InvalidInput(str(exc)) from exc


def recommendation_requirements(payload: InferenceRecommendationRequest) -> Requirements:
    """What a recommendation request asks of a candidate: objective, SLO (ms -> s) with its
    margin, throughput target, price kind, and a decoder's TTFT / TPOT p99 bounds."""
    return Requirements(
        objective=payload.objective,
        latency_slo_s=None if payload.latency_slo_ms is None else payload.latency_slo_ms / 1e3,
        throughput_target_per_s=payload.throughput_target_per_s,
        slo_margin_fraction=payload.slo_margin,
        price_kind=payload.price_kind,
        ttft_p99_s=None if payload.ttft_p99_ms is None else payload.ttft_p99_ms / 1e3,
        tpot_p99_s=None if payload.tpot_p99_ms is None else payload.tpot_p99_ms / 1e3,
        max_batched_tokens=payload.max_num_batched_tokens,
        max_num_seqs=payload.max_num_seqs,
        request_lengths=request_lengths(payload),
    )


def request_lengths(payload: InferenceRecommendationRequest) -> RequestLengths | None:
    """The request's length distributions in the domain's terms (None when neither side is
    given: every simulated request at the mean lengths, as before distributions). A side left
    out, or of kind fixed, is every request at its mean (else its maximum)."""
    if payload.prompt_length_distribution is None and payload.generated_length_distribution is None:
        return None
    try:
        return RequestLengths(
            prompt=_length_distribution(
                payload.prompt_length_distribution,
                limit_tokens=payload.prompt_tokens,
                mean_tokens=payload.prompt_tokens_mean or payload.prompt_tokens,
            ),
            generated=_length_distribution(
                payload.generated_length_distribution,
                limit_tokens=payload.generated_tokens,
                mean_tokens=payload.generated_tokens_mean or payload.generated_tokens,
            ),
        )
    except LengthDistributionError as exc:
        raise InvalidInput(str(exc), pointer="/prompt_length_distribution") from exc


def _length_distribution(
    spec: LengthDistributionSpec | None, *, limit_tokens: int, mean_tokens: int
) -> LengthDistribution:
    """One side's distribution (the schema has checked its parameters and bounds)."""
    if spec is None or spec.kind is LengthKind.FIXED:
        return LengthDistribution(
            kind=LengthKind.FIXED, tokens=mean_tokens, limit_tokens=limit_tokens
        )
    if spec.kind is LengthKind.LOGNORMAL:
        assert spec.mean_tokens is not None
        sigma = (
            spec.sigma
            if spec.p99_tokens is None
            else lognormal_sigma(spec.mean_tokens, spec.p99_tokens)
        )
        return LengthDistribution(
            kind=spec.kind,
            mean_tokens=spec.mean_tokens,
            sigma=sigma,
            p99_tokens=spec.p99_tokens,
            limit_tokens=limit_tokens,
        )
    if spec.kind is LengthKind.UNIFORM:
        return LengthDistribution(
            kind=spec.kind,
            min_tokens=spec.min_tokens,
            max_tokens=spec.max_tokens,
            limit_tokens=limit_tokens,
        )
    bins = tuple(sorted((item.tokens, item.weight) for item in spec.bins or []))
    return LengthDistribution(kind=spec.kind, bins=bins, limit_tokens=limit_tokens)


def fuse_elementwise(payload: InferenceRecommendationRequest) -> bool:
    """fuse_elementwise as given, else what the serving runtime does."""
    if "fuse_elementwise" in payload.model_fields_set:
        return payload.fuse_elementwise
    return RUNTIME_PROFILES[payload.serving_runtime].fuse_elementwise
