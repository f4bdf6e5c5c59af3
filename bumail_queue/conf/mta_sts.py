"""``MTA_STS``, ``MTA_STS_HTTPS_PORT`` and ``TLS_CA_FILE``."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any

from .defaults import DEFAULTS
from .validator import Validator


def check_mta_sts(check: Validator, raw: Mapping[str, Any]) -> None:
    """Check ``MTA_STS``, ``MTA_STS_HTTPS_PORT`` and ``TLS_CA_FILE``: a flag, a port, a
    file of PEM certificates this process can read."""
    if not isinstance(raw.get("MTA_STS", DEFAULTS["MTA_STS"]), bool):
        check.add(
            "bumail_queue.E027", "MTA_STS", f"BUMAIL_QUEUE['MTA_STS'] must be True or False; got {raw['MTA_STS']!r}."
        )
    check.port(raw, "MTA_STS_HTTPS_PORT", "bumail_queue.E027")
    ca_file = raw.get("TLS_CA_FILE")
    if ca_file is None:
        return
    problem = _ca_file_problem(ca_file)
    if problem is not None:
        check.add(
            "bumail_queue.E027",
            "TLS_CA_FILE",
            f"BUMAIL_QUEUE['TLS_CA_FILE'] must be None (the system's trust store) or the path of a file of PEM "
            f"CA certificates; {ca_file!r} {problem}.",
        )


def _ca_file_problem(ca_file: Any) -> str | None:
    """Say why ``ca_file`` is no readable file of CA certificates, or return ``None``."""
    if not isinstance(ca_file, str | os.PathLike) or not os.fspath(ca_file):
        return "is not a path"
    path = os.fspath(ca_file)
    if not os.path.isfile(path):
        return "is not a file"
    if not os.access(path, os.R_OK):
        return "cannot be read by this process"
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as error:
        return f"holds no certificate Python's ssl module can load ({error})"
    return None
