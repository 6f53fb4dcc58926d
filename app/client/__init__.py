"""Python client of the Capacity Planner API (httpx), and the ``capplan`` command line.

from app.client import CapacityPlannerClient
with CapacityPlannerClient("http://127.0.0.1:8000", api_key="...") as client:
    estimate = client.estimate_memory({"model": "llama-3-8b", "mode": "inference",
                                       "batch_size": 8, "precision": "bf16"})
    print(estimate.peak_bytes)

``CapacityPlannerClient`` answers with the service's pydantic schemas, so it needs the
``capacity-planner`` package; ``JsonClient`` (plain JSON) and ``capplan`` need only httpx and
are what the ``capacity-planner-client`` package ships to run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.client.transport import ApiError, JsonClient

if TYPE_CHECKING:
    from app.client.api import CapacityPlannerClient

__all__ = ["ApiError", "CapacityPlannerClient", "JsonClient"]


def __getattr__(name: str) -> Any:
    """Import the typed client (pydantic and the schemas) only when it is asked for."""
    if name == "CapacityPlannerClient":
        try:
            from app.client.api import CapacityPlannerClient
        except ImportError as exc:
            raise ImportError(
                "app.client.CapacityPlannerClient answers with the service's schemas and needs "
                f"the capacity-planner package ({exc}); JsonClient needs only httpx"
            ) from exc
        return CapacityPlannerClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
