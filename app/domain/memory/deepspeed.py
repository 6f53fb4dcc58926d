"""DeepSpeed ZeRO's GPU buffers: the contiguous gradient (IPG) reduce bucket and, from stage 3,
the gathered-parameter working set, sized by DeepSpeed's knobs
(:class:`app.domain.workload.DeepSpeedBuffers`, DeepSpeed's defaults when not given).

Sources (DeepSpeed 0.16+):

* deepspeed/runtime/zero/config.py ``DeepSpeedZeroConfig``: ``reduce_bucket_size`` 5e8,
  ``stage3_prefetch_bucket_size`` 5e7, ``stage3_max_live_parameters`` 1e9 elements,
  ``contiguous_gradients`` True, ``overlap_comm`` None -> True at stage 3 only
  (``overlap_comm_valid``);
* deepspeed/runtime/zero/stage_1_and_2.py ``backward``: with contiguous_gradients,
  ``ipg_buffer = [torch.empty(reduce_bucket_size, dtype=self.dtype, device=GPU)]`` (a second
  one when overlap_comm);
* deepspeed/runtime/zero/stage3.py ``_setup_for_real_optimizer``: with contiguous_gradients, one
  ``torch.empty(reduce_bucket_size, dtype)`` bucket per communication dtype on the GPU; the
  gradient partitions (``grad_partitions_flat_buffer``) on ``self.device``, the CPU under
  offload_optimizer;
* deepspeed/runtime/zero/partitioned_param_coordinator.py: a submodule's parameters are
  gathered whole before it runs; parameters up to ``prefetch_bucket_size`` elements ahead are
  prefetched while fewer than ``max_live_parameters`` are resident (the bound is on the
  prefetch: ``min(max_n_available_params - n_available_params, prefetch_bucket_sz)``);
  ``release_sub_module`` releases only ``__params_to_release``: once the trace is complete
  (from the third step), a submodule's parameters are kept when they occur again among the
  submodules run within ``max_reuse_distance_in_numel`` parameter elements after it
  (``stage3_max_reuse_distance``, default 1e9): the forward + backward trace reuses the last
  layers of the forward at the start of the backward (the same rule since DeepSpeed 0.8.0);
* deepspeed/runtime/zero/partition_parameters.py ``all_gather_coalesced``: under
  ``offload_param`` the gather copies each host partition to the GPU (``ds_tensor.to(device)``)
  next to the full gathered buffer (v0.8.0 to 2025).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from app.domain.memory.context import Estimation
from app.domain.memory.formulas import ceil_fraction
from app.domain.memory.rank_share import tied_weight_numel


def reduce_bucket_bytes(reduce_bucket_size: int, element_bytes: Fraction, buckets: int) -> int:
    """The IPG reduce bucket(s) [B].

    Parameters
    ----------
    reduce_bucket_size : int
        DeepSpeed ``reduce_bucket_size`` [elements].
    element_bytes : Fraction
        Bytes per element of the model's parameters (the bucket's dtype) [B].
    buckets : int
        Buckets allocated: 2 with overlap_comm at stage 1-2, else 1.

    Notes
    -----
    ``buckets x reduce_bucket_size x element_bytes``, whatever the model's size.
    """
    return ceil_fraction(buckets * reduce_bucket_size * element_bytes)


def reuse_kept_elements(module_elements: Sequence[int], max_reuse_distance: int) -> int:
    """Parameter elements ZeRO-3 keeps gathered from the end of the forward into the backward
    because they are reused within ``stage3_max_reuse_distance`` [elements].

    Parameters
    ----------
    module_elements : Sequence[int]
        Parameter elements of each submodule in forward order [elements].
    max_reuse_distance : int
        DeepSpeed ``stage3_max_reuse_distance`` [elements].

    Notes
    -----
    The trace is the forward, then the backward in reverse order. After submodule ``i`` runs
    forward, ``__params_to_release`` walks the trace from the next submodule, adding up the
    parameter elements it passes, and keeps ``i``'s parameters when it meets ``i`` again before
    the sum reaches the distance: the walk passes the ``S_i`` elements of the submodules after
    ``i`` in the forward and again in the backward, so ``i`` is kept when
    ``2 x S_i < max_reuse_distance``; the sum of those ``i`` (the last submodule always among
    them) is gathered at the start of the backward. Every submodule after ``i`` is assumed to
    run a backward (its output requires grad).

    References
    ----------
    deepspeed/runtime/zero/partitioned_param_coordinator.py ``__params_to_release`` (v0.8.0 to
    v0.16+): ``for module in self.__submodule_order[step_id:]: if params_traversed >=
    self.__max_reuse_dist_in_numel: break; for param in iter_params(module):
    params_to_release.discard(param.ds_id); params_traversed += param.ds_numel``.
    """
    kept = 0
    after = 0  # S_i: elements of the submodules after i
    for elements in reversed(module_elements):
        if 2 * after < max_reuse_distance:
            kept += elements
        after += elements
    return kept


def gathered_params_elements(largest_module: int, prefetch: int, max_live: int) -> int:
    """Parameter elements a ZeRO-3 GPU holds gathered at once [elements]: the largest
    submodule's, gathered whole to run (or the submodules kept for reuse,
    :func:`reuse_kept_elements`, when more), and the elements prefetched ahead of it.

    Notes
    -----
    ``largest_module + max(0, min(prefetch, max_live - largest_module))``:
    deepspeed/runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module`` all-gathers
    the running submodule's parameters unconditionally, then prefetches while
    ``numel_prefetching < min(max_n_available_params - n_available_params,
    prefetch_bucket_sz)``: ``stage3_max_live_parameters`` bounds the prefetch, not the
    running submodule. Approximated: DeepSpeed fetches by parameter, so the prefetched
    elements round to whole parameters.
    """
    return largest_module + max(0, min(prefetch, max_live - largest_module))


def offload_gather_copy_elements(largest_module: int, prefetch: int, data: int) -> int:
    """The GPU copy of host partitions a ZeRO-3 all-gather makes under ``offload_param``
    [elements], held with the gathered buffer while the gather runs.

    Parameters
    ----------
    largest_module : int
        Parameter elements of the largest submodule [elements].
    prefetch : int
        Parameter elements prefetched in one coalesced gather [elements].
    data : int
        Data-parallel ranks the parameters are partitioned over.

    Notes
    -----
    ``ceil(max(largest_module, prefetch) / data)``: with ``offload_param`` a parameter's
    partition (``ds_tensor``) lives in host memory, and the all-gather first copies it to the
    GPU. deepspeed/runtime/zero/partition_parameters.py ``all_gather_coalesced`` (v0.8.0
    lines 836-853, unchanged in 2025): one parameter: ``param_buffer = torch.empty(ceil(ds_numel
    / world_size) * world_size, device=GPU)``, then ``_dist_allgather_fn(param.ds_tensor.to(
    GPU), param_buffer, ...)``: the full buffer and the GPU copy of the partition are allocated
    together; several (a prefetch, lines 855-870): ``torch.cat([p.ds_tensor.to(GPU) for p in
    params], out=partitions[rank])`` next to the flat buffer. The copies are dropped once the
    collective is launched, so the larger of the two gathers counts, not their sum. Without
    offload the partition already lives on the GPU (``.to`` returns it): no copy.
    """
    return -(-max(largest_module, prefetch) // data)


def deepspeed_buffers(e: Estimation) -> dict[str, int]:
    """DeepSpeed's GPU lines for this request (empty when the ZeRO lines are FSDP's)."""
    par = e.request.parallelism
    if not par.uses_deepspeed:
        return {}
    knobs = par.deepspeed_buffers
    given = par.deepspeed is not None
    element = e.plan.weight
    buckets = 1  # overlap_comm's default is True at stage 3 only, which keeps one bucket
    lines: dict[str, int] = {}
    bucket = reduce_bucket_bytes(knobs.reduce_bucket_size, element, buckets)
    if bucket:
        lines["zero_reduce_bucket"] = bucket
        e.formulas["zero_reduce_bucket"] = (
            f"ceil({buckets} [bucket] x {knobs.reduce_bucket_size:,} [elements: "
            f"reduce_bucket_size] x {element} [B, the parameters' dtype]) = {bucket:,} B"
        )
        e.notes["zero_reduce_bucket"] = [
            "DeepSpeed's contiguous gradient (IPG) bucket, torch.empty(reduce_bucket_size) on "
            "the GPU whatever the model's size (contiguous_gradients=True, DeepSpeed's default)"
        ]
    if par.zero_stage >= 3:
        model_shard = par.tensor * par.pipeline
        # a layer is a submodule; a tied output head gathers the weight it reads
        modules = [layer.result.params + tied_weight_numel(layer) for layer in e.analysis.layers]
        largest = max(modules, default=0)
        kept = reuse_kept_elements(modules, knobs.stage3_max_reuse_distance)
        resident = max(largest, kept)
        elements = gathered_params_elements(
            resident, knobs.stage3_prefetch_bucket_size, knobs.stage3_max_live_parameters
        )
        prefetched = elements - resident
        # offload_param: the gather's GPU copy of the host partition (offload_gather_copy_elements)
        copied = (
            offload_gather_copy_elements(largest, prefetched, par.data) if par.cpu_offload else 0
        )
        elements += copied
        gathered = ceil_fraction(elements * element / model_shard)
        if gathered:
            lines["zero_gathered_params"] = gathered
            what = (
                f"{resident:,} params kept gathered for reuse at the start of the backward "
                f"(the last layers', 2 x the params after each < stage3_max_reuse_distance "
                f"{knobs.stage3_max_reuse_distance:,})"
                if kept > largest
                else f"{resident:,} params of the largest layer, gathered whole to run"
            )
            e.formulas["zero_gathered_params"] = (
                f"ceil({elements:,} [elements: {what}, + max(0, min(stage3_prefetch_bucket_size "
                f"{knobs.stage3_prefetch_bucket_size:,}, stage3_max_live_parameters "
                f"{knobs.stage3_max_live_parameters:,} - {resident:,})) prefetched"
                + (
                    f" + {copied:,} [elements: offload_param: the all-gather's GPU copy of the "
                    f"host partition, ceil(max({largest:,} largest layer, {prefetched:,} "
                    f"prefetched) / {par.data} data rank(s))]"
                    if copied
                    else "]"
                )
                + f" x {element} [B] / {model_shard} [tensor x pipeline]) = {gathered:,} B"
            )
            e.notes["zero_gathered_params"] = [
                "ZeRO-3 gathers a submodule's parameters whole before it runs and prefetches "
                "up to stage3_prefetch_bucket_size elements ahead while fewer than "
                "stage3_max_live_parameters are resident "
                "(deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module); "
                "it releases them after use unless the trace uses them again within "
                "stage3_max_reuse_distance elements (__params_to_release), which keeps the "
                f"last layers of the forward, {kept:,} params here, gathered into the backward"
            ]
            if copied:
                e.notes["zero_gathered_params"].append(
                    "offload_param: the all-gather copies the host partition to the GPU "
                    "(ds_tensor.to(device)) next to the full gathered buffer "
                    "(deepspeed/runtime/zero/partition_parameters.py all_gather_coalesced)"
                )
    e.comm_buffers += list(lines.values())
    where = "as given" if given else "DeepSpeed's defaults (deepspeed/runtime/zero/config.py)"
    e.assumptions.append(
        f"DeepSpeed ZeRO-{par.zero_stage} on {par.data} data rank(s): reduce_bucket_size "
        f"{knobs.reduce_bucket_size:,}, stage3_prefetch_bucket_size "
        f"{knobs.stage3_prefetch_bucket_size:,}, stage3_max_live_parameters "
        f"{knobs.stage3_max_live_parameters:,}, stage3_max_reuse_distance "
        f"{knobs.stage3_max_reuse_distance:,} elements ({where})"
        + ("; one data rank: nothing is sharded" if par.data == 1 else "")
    )
    return lines
