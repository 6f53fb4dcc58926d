"""Binary size units: the only place they are defined."""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30
