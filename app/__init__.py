"""Capacity Planner: memory footprints, MIG fit checks and inference recommendations."""
