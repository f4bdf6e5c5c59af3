"""What each key of ``BUMAIL_QUEUE`` is when a project leaves it out, and the bounds
the validators hold values to."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

SETTING_NAME: Final = "BUMAIL_QUEUE"

DEFAULTS: Final[Mapping[str, Any]] = {
    "STORE": "orm",
    "DATABASE": "default",
    "REDIS_CONNECTION": "default",
    "REDIS_KEY_PREFIX": "bumail:queue:",
    "HOSTNAME": None,  # socket.getfqdn() when read
    "ROUTE": {"TYPE": "mx"},
    # VERP: "bounces+{token}@example.com" gives each recipient an envelope sender of
    # its own, naming its item and recipient (docs/feedback.md); None: the item's sender.
    "RETURN_PATH": None,
    # Addresses queue_inbound also takes mail to: a feedback loop's, an abuse box.
    "FEEDBACK_ADDRESSES": [],
    # Mailboxes queue_inbound --imap/--pop3 fetches returned mail from: each URL, with
    # no secret in it, to its entry (conf.mailboxes.MAILBOX_KEYS; docs/settings.md).
    "INBOUND_MAILBOXES": {},
    "ROUTES": {},
    # Per channel: {"newsletter": <route>}, for all of a channel's mail but the domains
    # ROUTES names.
    "CHANNEL_ROUTES": {},
    # Per channel: {"newsletter": {"URL": "https://.../mail/unsubscribe/", "DURATION": ...}}:
    # its mail gets one-click List-Unsubscribe (RFC 8058) for each recipient.
    "UNSUBSCRIBE": {},
    # Per channel, how long delivered mail is kept whole: {"default": "7d", "newsletter": "0d"}
    # ("default" also stands for the channels not named); then its header section alone
    # until REDACT_AFTER from the archiving (docs/operations.md, "Archive and retention").
    "ARCHIVE": {},
    "REDACT_AFTER": "30d",
    "MX_PORT": 25,
    "DNS_NAMESERVERS": None,
    "CONCURRENCY": 20,
    "DOMAIN_CONCURRENCY": 20,
    "LEASE_SECONDS": 600,
    "MAX_AGE": timedelta(days=5),
    "DELAY_WARNING": timedelta(hours=4),
    # The priority of the DSNs the worker sends (-100 to 100); each goes in the
    # channel of the mail it reports on.
    "DSN_PRIORITY": 0,
    "MAX_ITEMS": None,
    "MAX_MESSAGE_SIZE": 25 * 1024 * 1024,
    # Postfix's smtpd_recipient_limit.
    "MAX_RECIPIENTS": 1000,
    # Networks that MX, A/AAAA and address-literal destinations may be in beyond the
    # globally routable ones (ROUTE/ROUTES hosts are trusted as written).
    "ALLOWED_PRIVATE_NETWORKS": [],
    # Postfix's smtp_mx_address_limit and smtp_mx_session_limit.
    "MX_ADDRESS_LIMIT": 5,
    "MX_SESSION_LIMIT": 2,
    # RFC 5321 §4.5.4.1: hosts that did not answer are not tried again for this long
    # (Postfix keeps a dead destination for minimal_backoff_time, 300 s); 0: off.
    "UNREACHABLE_HOST_MEMORY": timedelta(minutes=5),
    # DKIM signers (RFC 6376, RFC 8463), each {"DOMAIN", "SELECTOR", "KEY", "ALGORITHM"};
    # a message whose signing fails waits (deferred) unless DKIM_UNSIGNED_ON_ERROR.
    "DKIM": [],
    "DKIM_UNSIGNED_ON_ERROR": False,
    # RFC 8461 for MX delivery, as KumoMTA has it: on unless turned off. The policy is
    # fetched over HTTPS from port MTA_STS_HTTPS_PORT; TLS_CA_FILE (None: the system's
    # trust store) verifies policy hosts, MX hosts under a policy and smarthosts.
    "MTA_STS": True,
    "MTA_STS_HTTPS_PORT": 443,
    "TLS_CA_FILE": None,
    # RFC 5321 §4.5.4.1: retries at least 30 minutes apart, growing, with jitter.
    "RETRY_MIN_DELAY": timedelta(minutes=30),
    "RETRY_MAX_DELAY": timedelta(hours=4),
    "RETRY_FACTOR": 2.0,
    "RETRY_JITTER": 0.1,
    "TIMEOUTS": {},
    "CONNECTION_REUSE_SECONDS": 10,
    "CLAIM_BATCH_SIZE": 50,
    "POLL_SECONDS": 5,
    # The delivery log: each recipient's outcome, kept after the item left the queue.
    "DELIVERY_LOG": True,
    "DELIVERY_LOG_RETENTION": timedelta(days=30),
    # A task framework to send a delivery task to on commit of each enqueue
    # (docs/tasks.md): None (off), "django", "celery", or a dict with FRAMEWORK.
    "TASKS": None,
    # Prometheus metrics (docs/metrics.md): the recipient domains that get a label of
    # their own (every other is "other"), and the bearer token of the metrics view.
    "METRICS_DOMAINS": [],
    "METRICS_TOKEN": None,
    # The suppression list: addresses whose mailbox or domain does not exist, or whose
    # delivery time expired twice within SUPPRESSION_EXPIRY_WINDOW (None: never), fail
    # at once for SUPPRESSION_DURATION; SUPPRESSION_DSN: with a DSN, as other failures.
    "SUPPRESSION": True,
    "SUPPRESSION_DURATION": timedelta(days=30),
    "SUPPRESSION_EXPIRY_WINDOW": timedelta(days=30),
    "SUPPRESSION_DSN": True,
    # Limits per destination pattern, held across every worker (docs/shaping.md).
    "SHAPING": {},
    # The staging firewall (docs/operations.md): None lets mail go to every recipient;
    # a list of domain and address patterns holds mail to any other, or sends it to
    # REDIRECT_TO instead when that is set.
    "ALLOW_RECIPIENTS": None,
    "REDIRECT_TO": None,
}

#: RFC 5321 §4.5.3.2's timeouts, in seconds; ``TIMEOUTS`` overrides any of them.
#: CONNECT and SESSION are ours: the TCP connection, and a whole session, DNS included.
DEFAULT_TIMEOUTS: Final[Mapping[str, float]] = {
    "CONNECT": 30,
    "GREETING": 300,
    "MAIL": 300,
    "RCPT": 300,
    "DATA": 120,
    "DATA_BLOCK": 180,
    "DATA_END": 600,
    "SESSION": 1800,
}

#: The store aliases bumail_queue ships; anything else is a dotted path.
BUILTIN_STORES: Final = {
    "orm": "bumail_queue.stores.orm.ORMStore",
    "memory": "bumail_queue.stores.memory.MemoryStore",
    "redis": "bumail_queue.stores.redis.RedisStore",
}

#: The most ``METRICS_DOMAINS`` a project may name: each is a label value of every
#: worker's attempt counters, and Prometheus keeps a series per value.
MAX_METRICS_DOMAINS: Final = 50
#: The shortest ``METRICS_TOKEN``: 16 characters, guessed by no one.
MIN_METRICS_TOKEN: Final = 16
# Durations beyond this are a mistake (and beyond what a timer or timedelta holds).
MAX_DURATION_SECONDS = 10 * 366 * 24 * 3600
# The longest a step may wait: 2**31 - 1 ms (about 24 days), the most a timer of
# many platforms and libraries holds; anything longer is a mistake.
MAX_TIMEOUT_SECONDS = 2147483
