"""The S3 XML bodies ``ObjectStore`` sends and reads, sans-IO: bytes in, values out (and back).

ListObjectsV2 pages, DeleteObjects requests (with the Content-MD5 S3 requires for them) and their
per-key results, CreateBucket configurations, and error answers. Element names are matched without
their namespace: AWS, MinIO and SeaweedFS send the 2006-03-01 namespace, some proxies and older
servers send none.

Listings are asked for without ``encoding-type=url``: the keys this project writes are plain ASCII
paths, which XML carries as they are (keys with control characters, which XML 1.0 cannot, are never
written).
"""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET
from datetime import datetime
from typing import NamedTuple
from xml.sax.saxutils import escape

__all__ = [
    "ObjectInfo",
    "create_bucket_body",
    "delete_objects_body",
    "parse_delete_errors",
    "parse_error",
    "parse_list_page",
]

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"


class ObjectInfo(NamedTuple):
    """One listed object."""

    key: str
    size: int
    last_modified_ms: int


def _ns(root: ET.Element) -> str:
    """The ``{namespace}`` prefix of the root's tag, or ``""``; children share it."""
    return root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""


def _ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.strip()).timestamp() * 1000)


def parse_list_page(body: bytes) -> tuple[list[ObjectInfo], str | None]:
    """A ListObjectsV2 page: its objects in order, and the continuation token if more pages follow."""
    root = ET.fromstring(body)
    ns = _ns(root)
    items = [
        ObjectInfo(
            contents.findtext(f"{ns}Key") or "",
            int(contents.findtext(f"{ns}Size") or 0),
            _ms(contents.findtext(f"{ns}LastModified") or ""),
        )
        for contents in root.iterfind(f"{ns}Contents")
    ]
    if (root.findtext(f"{ns}IsTruncated") or "").strip().lower() != "true":
        return items, None
    token = root.findtext(f"{ns}NextContinuationToken")
    if not token:
        raise ValueError("truncated ListObjectsV2 page without a NextContinuationToken")
    return items, token


def delete_objects_body(keys: list[str]) -> tuple[bytes, str]:
    """A quiet DeleteObjects request body (the answer lists only failures) and its base64 Content-MD5."""
    objects = "".join(f"<Object><Key>{escape(key)}</Key></Object>" for key in keys)
    body = f'<?xml version="1.0" encoding="UTF-8"?><Delete><Quiet>true</Quiet>{objects}</Delete>'.encode()
    # MD5 is what the DeleteObjects API demands here, as a checksum, not for security.
    md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
    return body, md5


def parse_delete_errors(body: bytes) -> list[tuple[str, str]]:
    """``(key, code)`` of each key a DeleteObjects answer reports as not deleted."""
    root = ET.fromstring(body)
    ns = _ns(root)
    return [
        (error.findtext(f"{ns}Key") or "", error.findtext(f"{ns}Code") or "") for error in root.iterfind(f"{ns}Error")
    ]


def parse_error(body: bytes) -> tuple[str, str]:
    """``(code, message)`` of an S3 error answer; ``("", "")`` when the body is not one (a proxy's page)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return "", ""
    ns = _ns(root)
    if root.tag != f"{ns}Error":
        return "", ""
    return (root.findtext(f"{ns}Code") or "").strip(), (root.findtext(f"{ns}Message") or "").strip()


def create_bucket_body(region: str) -> bytes:
    """The CreateBucket body: empty in us-east-1, the one region that rejects an explicit location."""
    if region == "us-east-1":
        return b""
    return (
        f'<CreateBucketConfiguration xmlns="{NAMESPACE}">'
        f"<LocationConstraint>{escape(region)}</LocationConstraint></CreateBucketConfiguration>"
    ).encode()
