"""Pure domain core: stdlib only, no web framework, ORM, validation library or I/O."""
