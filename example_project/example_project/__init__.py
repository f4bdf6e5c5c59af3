"""The example project's settings package."""

from __future__ import annotations
