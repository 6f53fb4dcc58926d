"""Persistence: SQLAlchemy models, engine/session, repositories."""
