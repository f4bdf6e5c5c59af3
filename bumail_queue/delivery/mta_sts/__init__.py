"""MTA-STS (RFC 8461): a recipient domain's policy, found, fetched, kept and applied.

``STSPolicies.policy_for(domain)`` says which policy applies to a delivery now:

1. the ``_mta-sts.<domain>`` TXT record is looked up through the configured DNS
   (``DNS_NAMESERVERS``); a valid one (``v=STSv1; id=...``) announces a policy;
2. a policy kept with that id and not expired applies as it is: first this process's
   copy, then the store's (``PolicyCache``: every worker shares it);
3. otherwise it is fetched from ``https://mta-sts.<domain>/.well-known/mta-sts.txt``:
   the host's address found through the same DNS and held to the destination policy
   (``ALLOWED_PRIVATE_NETWORKS``), the connection made to that address with SNI and
   ``Host`` naming ``mta-sts.<domain>``, its certificate verified for that name
   against ``TLS_CA_FILE`` (the system's trust store when ``None``); no redirect is
   followed, the body must be ``text/plain`` and at most 64 KiB, the whole fetch
   takes at most ``FETCH_SECONDS``. The policy parsed is stored with its id and
   ``max_age``;
4. with no valid TXT record, or when the fetch fails, a policy kept and not expired
   still applies (so an ``enforce`` policy survives a DNS that stops answering until
   its ``max_age`` runs out); without one, the domain has no policy.

A fetch that failed is not tried again for the same id for
``FAILED_FETCH_MEMORY_SECONDS``, by any worker (the store keeps the failure), and threads that need one domain's policy at once
wait for one fetch. ``AppliedPolicy`` then says what the policy does to the route
and its MX hosts (``enforce``: only hosts its ``mx`` patterns match, verified TLS)
and turns the sessions' TLS into the counts of the TLS report (RFC 8460).

The HTTPS client is urllib3: it connects to the address chosen here and verifies
the certificate for the policy host's name (``server_hostname``), follows nothing
unless told, and reads a body in bounded pieces (``docs/mta-sts.md`` says why it
was chosen).
"""

from __future__ import annotations

from .https import MAX_POLICY_SIZE
from .policies import FAILED_FETCH_MEMORY_SECONDS, FETCH_SECONDS, PolicyCache, STSPolicies
from .policy import AppliedPolicy, PolicyError, parse_policy, parse_txt

__all__ = [
    "FAILED_FETCH_MEMORY_SECONDS",
    "FETCH_SECONDS",
    "MAX_POLICY_SIZE",
    "AppliedPolicy",
    "PolicyCache",
    "PolicyError",
    "STSPolicies",
    "parse_policy",
    "parse_txt",
]
