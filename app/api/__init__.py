"""HTTP adapter: routers, dependencies, middleware and problem+json errors."""
