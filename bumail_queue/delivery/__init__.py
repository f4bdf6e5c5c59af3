"""The delivery layer: routes, DNS, SMTP sessions, retries and DSNs, used by the worker."""
