"""Use cases: repositories -> domain -> schemas; each write use case owns its commit."""
