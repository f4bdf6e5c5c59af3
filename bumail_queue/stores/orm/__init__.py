"""The ORM store: the queue in the project's own database (``store`` says how).

``ORMStore`` is what ``STORE = "orm"`` builds; the other modules are its parts.
"""

from __future__ import annotations

from .store import ORMStore

__all__ = ["ORMStore"]
