"""The example project's one app: write a mail, see the queue, cancel an item."""

from __future__ import annotations
