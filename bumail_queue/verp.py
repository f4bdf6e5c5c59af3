"""VERP return paths: each recipient's envelope sender names its item and recipient.

With ``RETURN_PATH = "bounces+{token}@example.com"`` every recipient of an item gets a
transaction of its own, from ``bounces+<token>@example.com``. A bounce goes back to the
envelope sender, so the address it comes back to says whose it is, even when its body
is malformed or names another address (a forward, an alias).

The token is ``<item>.<signature>``: the item's id (a UUID, 26 characters of
lowercase base32) and 16 characters of an HMAC of the item's id and the recipient,
keyed with ``SECRET_KEY`` through Django's ``salted_hmac``. Checking it needs no
database: given the address a bounce came back to and a candidate recipient (the one
its report names, or each of the item's, from the queue or the delivery log), the
signature says whether that recipient is the one. Nobody without the key can make one
that names a recipient, so a forged bounce cannot suppress an address. Lowercase
base32, because some MTAs change the case of a local part.
"""

from __future__ import annotations

import base64
import dataclasses
import hmac
import uuid
from typing import Final

from django.conf import settings
from django.utils.crypto import salted_hmac

from bumail_queue.addresses import normal_address

PLACEHOLDER: Final = "{token}"
LOCAL_PART_LIMIT: Final = 64  # RFC 5321 §4.5.3.1.1, octets
_SALT: Final = "bumail_queue.verp"
_SIGNATURE_BYTES: Final = 10  # 80 bits, 16 characters of base32


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReturnedTo:
    """What a VERP address says: the item, and the signature its recipient must match."""

    item_id: str
    signature: str

    def names(self, address: str) -> bool:
        """Whether ``address`` is the recipient this return path was made for."""
        return any(
            hmac.compare_digest(self.signature, _signature(self.item_id, address, key)) for key in _verifying_keys()
        )


def return_path(template: str, item_id: str, address: str) -> str | None:
    """The envelope sender of ``item_id``'s mail to ``address`` under ``template``; ``None``
    when it cannot have one (an item id that is no UUID would make the local part too
    long for RFC 5321)."""
    item = _item_part(item_id)
    if item is None:
        return None
    token = f"{item}.{_signature(item_id, address, settings.SECRET_KEY)}"
    return template.replace(PLACEHOLDER, token)


def read_return_path(template: str, address: str) -> ReturnedTo | None:
    """What ``address`` (an envelope sender made from ``template``) names, or ``None``
    when it is not one of them."""
    prefix, _, suffix = template.partition(PLACEHOLDER)
    local, at, domain = address.strip().strip("<>").rpartition("@")
    t_domain = (prefix + suffix).rpartition("@")[2]
    if not at or domain.lower() != t_domain.lower():
        return None
    whole = f"{local}@{domain}"
    if not (whole.lower().startswith(prefix.lower()) and whole.lower().endswith(suffix.lower())):
        return None
    token = whole[len(prefix) : len(whole) - len(suffix)].lower()
    item, dot, signature = token.partition(".")
    item_id = _item_id(item) if dot else None
    if item_id is None or len(signature) != 16:
        return None
    return ReturnedTo(item_id=item_id, signature=signature)


def local_part_length(template: str) -> int:
    """The octets of the local part of a return path made from ``template``."""
    sample = template.replace(PLACEHOLDER, "x" * (26 + 1 + 16))
    return len(sample.rpartition("@")[0].encode())


def _item_part(item_id: str) -> str | None:
    try:
        raw = uuid.UUID(item_id).bytes
    except ValueError:
        return None
    return base64.b32encode(raw).decode().rstrip("=").lower()


def _item_id(part: str) -> str | None:
    if len(part) != 26:
        return None
    try:
        return str(uuid.UUID(bytes=base64.b32decode(part.upper() + "======")))
    except (ValueError, TypeError):
        return None


def _signature(item_id: str, address: str, key: str | bytes) -> str:
    digest = salted_hmac(_SALT, f"{item_id}\n{normal_address(address)}", secret=key, algorithm="sha256").digest()
    return base64.b32encode(digest[:_SIGNATURE_BYTES]).decode().lower()


def _verifying_keys() -> list[str | bytes]:
    """``SECRET_KEY`` and its fallbacks: a return path made before the key was rotated
    still names its recipient."""
    return [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
