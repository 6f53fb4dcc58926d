"""Python client of the Capacity Planner API (httpx), and the ``capplan`` command line.

from app.client import CapacityPlannerClient
with CapacityPlannerClient("http://127.0.0.1:8000", api_key="...") as client:
    estimate = client.estimate_memory({"model": "llama-3-8b", "mode": "inference",
                                       "batch_size": 8, "precision": "bf16"})
    print(estimate.peak_bytes)
"""

from app.client.api import ApiError, CapacityPlannerClient

__all__ = ["ApiError", "CapacityPlannerClient"]
