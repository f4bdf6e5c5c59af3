"""Operating a queue at scale, between the service and the worker: ``bulk`` (acting on
a filter's items in batches, the dry run, the audit entry)."""
