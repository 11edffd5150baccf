"""S3 XML bodies: ListObjectsV2 pages, DeleteObjects requests and results, error answers.

The samples follow the S3 API reference's examples (namespaced, as AWS, MinIO and SeaweedFS send them)
plus the shapes servers actually vary in: no namespace, empty results, missing optional elements.
"""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.storage.s3_xml import (
    ObjectInfo,
    create_bucket_body,
    delete_objects_body,
    parse_delete_errors,
    parse_error,
    parse_list_page,
)

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def test_list_page_truncated_with_token() -> None:
    body = f"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="{NS}">
  <Name>bucket</Name><Prefix>wal/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>wal/a&amp;b</Key><LastModified>2009-10-12T17:50:30.000Z</LastModified>
    <ETag>"fba9dede5f27731c9771645a39863328"</ETag><Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>wal/c</Key><LastModified>2009-10-12T17:50:31Z</LastModified><Size>0</Size></Contents>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
</ListBucketResult>""".encode()
    items, token = parse_list_page(body)
    assert items == [ObjectInfo("wal/a&b", 434234, 1255369830000), ObjectInfo("wal/c", 0, 1255369831000)]
    assert token == "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="


def test_list_page_last_and_empty() -> None:
    last = f"""<ListBucketResult xmlns="{NS}"><IsTruncated>false</IsTruncated>
  <Contents><Key>k</Key><LastModified>2026-11-22T20:13:45.123+00:00</LastModified><Size>7</Size></Contents>
  <NextContinuationToken>ignored-when-not-truncated</NextContinuationToken></ListBucketResult>""".encode()
    assert parse_list_page(last) == ([ObjectInfo("k", 7, 1795378425123)], None)
    empty = b"<ListBucketResult><Name>b</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>"
    assert parse_list_page(empty) == ([], None)


def test_list_page_truncated_without_token_is_an_error() -> None:
    # Following an absent token would list the first page again, forever.
    with pytest.raises(ValueError):
        parse_list_page(b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>")


def test_delete_objects_body_is_quiet_and_escaped() -> None:
    body, md5 = delete_objects_body(["a", "b<&>'\""])
    root = ET.fromstring(body)
    assert root.tag == "Delete"
    assert root.findtext("Quiet") == "true"
    assert [o.findtext("Key") for o in root.findall("Object")] == ["a", "b<&>'\""]
    assert md5 == base64.b64encode(hashlib.md5(body).digest()).decode()


def test_parse_delete_errors() -> None:
    body = f"""<?xml version="1.0" encoding="UTF-8"?>
<DeleteResult xmlns="{NS}">
  <Deleted><Key>gone</Key></Deleted>
  <Error><Key>locked</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>
  <Error><Key>missing</Key><Code>NoSuchKey</Code></Error>
</DeleteResult>""".encode()
    assert parse_delete_errors(body) == [("locked", "AccessDenied"), ("missing", "NoSuchKey")]
    assert parse_delete_errors(b"<DeleteResult/>") == []


def test_parse_error() -> None:
    body = b"""<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The resource you requested does not exist</Message>
<Resource>/mybucket/myfoto.jpg</Resource><RequestId>4442587FB7D0A2F9</RequestId></Error>"""
    assert parse_error(body) == ("NoSuchKey", "The resource you requested does not exist")
    # Proxies and overloaded servers answer with HTML, plain text or nothing.
    assert parse_error(b"<html><body>502 Bad Gateway</body></html>") == ("", "")
    assert parse_error(b"upstream connect error") == ("", "")
    assert parse_error(b"") == ("", "")


def test_create_bucket_body() -> None:
    assert create_bucket_body("us-east-1") == b""  # the one region that rejects a LocationConstraint
    root = ET.fromstring(create_bucket_body("eu-west-1"))
    assert root.tag == f"{{{NS}}}CreateBucketConfiguration"
    assert root.findtext(f"{{{NS}}}LocationConstraint") == "eu-west-1"


xml_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Cn")), min_size=1, max_size=40)


@given(st.lists(xml_text, max_size=20))
def test_delete_body_round_trips_any_key(keys: list[str]) -> None:
    body, _ = delete_objects_body(keys)
    assert [o.findtext("Key") for o in ET.fromstring(body).findall("Object")] == keys
