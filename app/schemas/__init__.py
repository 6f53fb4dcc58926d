"""Pydantic request/response models: the API contract."""
