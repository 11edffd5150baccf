"""SigV4 signing against AWS's published S3 examples ("Examples: Signature Calculations", Amazon S3 API
reference: GET Object with a Range, PUT Object, GET Bucket Lifecycle, GET Bucket (List Objects)).

All four use the documentation's example key pair, bucket and instant.
"""

from __future__ import annotations

import calendar
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.storage.sigv4 import EMPTY_SHA256, SigV4Signer, amz_date, canonical_query, uri_encode

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AMZ_DATE = "20130524T000000Z"
HOST = "examplebucket.s3.amazonaws.com"


@pytest.fixture
def signer() -> SigV4Signer:
    return SigV4Signer(ACCESS_KEY, SECRET_KEY, "us-east-1")


def test_get_object_with_range(signer: SigV4Signer) -> None:
    headers = {"Host": HOST, "Range": "bytes=0-9", "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": AMZ_DATE}
    canonical, signed = signer.canonical_request("GET", "/test.txt", "", headers, EMPTY_SHA256)
    assert signed == "host;range;x-amz-content-sha256;x-amz-date"
    assert canonical == (
        "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
        f"x-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:20130524T000000Z\n\n{signed}\n{EMPTY_SHA256}"
    )
    assert signer.string_to_sign(AMZ_DATE, canonical) == (
        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    )
    assert signer.authorization("GET", "/test.txt", "", headers, EMPTY_SHA256, AMZ_DATE) == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_put_object(signer: SigV4Signer) -> None:
    body = b"Welcome to Amazon S3."
    payload_hash = hashlib.sha256(body).hexdigest()
    assert payload_hash == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
    headers = {
        "Host": HOST,
        "Date": "Fri, 24 May 2013 00:00:00 GMT",
        "x-amz-date": AMZ_DATE,
        "x-amz-storage-class": "REDUCED_REDUNDANCY",
        "x-amz-content-sha256": payload_hash,
    }
    path = "/" + uri_encode("test$file.text")
    assert path == "/test%24file.text"
    canonical, signed = signer.canonical_request("PUT", path, "", headers, payload_hash)
    assert signed == "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class"
    assert signer.string_to_sign(AMZ_DATE, canonical).endswith(
        "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d"
    )
    assert signer.authorization("PUT", path, "", headers, payload_hash, AMZ_DATE).endswith(
        "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
    )


def test_get_bucket_lifecycle_subresource(signer: SigV4Signer) -> None:
    headers = {"Host": HOST, "x-amz-date": AMZ_DATE, "x-amz-content-sha256": EMPTY_SHA256}
    query = canonical_query({"lifecycle": ""})
    assert query == "lifecycle="
    canonical, _ = signer.canonical_request("GET", "/", query, headers, EMPTY_SHA256)
    assert canonical.split("\n")[:3] == ["GET", "/", "lifecycle="]
    assert signer.authorization("GET", "/", query, headers, EMPTY_SHA256, AMZ_DATE).endswith(
        "Signature=fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"
    )


def test_list_objects_query_is_sorted(signer: SigV4Signer) -> None:
    headers = {"Host": HOST, "x-amz-date": AMZ_DATE, "x-amz-content-sha256": EMPTY_SHA256}
    query = canonical_query({"prefix": "J", "max-keys": "2"})
    assert query == "max-keys=2&prefix=J"
    canonical, _ = signer.canonical_request("GET", "/", query, headers, EMPTY_SHA256)
    assert signer.string_to_sign(AMZ_DATE, canonical).endswith(
        "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7"
    )
    assert signer.authorization("GET", "/", query, headers, EMPTY_SHA256, AMZ_DATE).endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_sign_adds_date_hash_and_authorization(signer: SigV4Signer) -> None:
    now = calendar.timegm((2013, 5, 24, 0, 0, 0))
    headers = {"Host": HOST, "Range": "bytes=0-9"}
    signer.sign("GET", "/test.txt", "", headers, EMPTY_SHA256, now)
    assert headers["x-amz-date"] == AMZ_DATE and headers["x-amz-content-sha256"] == EMPTY_SHA256
    assert headers["Authorization"].endswith("f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_signing_key_is_cached_per_date(signer: SigV4Signer) -> None:
    first = signer.signing_key("20130524")
    assert signer.signing_key("20130524") is first
    other = signer.signing_key("20130525")
    assert other != first
    assert signer.signing_key("20130524") == first  # recomputed after the day changed back: same key


def test_header_values_are_trimmed_and_spaces_collapsed(signer: SigV4Signer) -> None:
    canonical, signed = signer.canonical_request("GET", "/", "", {"X-Amz-Meta-A": "  a   b  c "}, EMPTY_SHA256)
    assert "x-amz-meta-a:a b c\n" in canonical and signed == "x-amz-meta-a"


def test_amz_date() -> None:
    assert amz_date(calendar.timegm((2013, 5, 24, 0, 0, 0)) + 0.75) == AMZ_DATE


def test_uri_encode() -> None:
    assert uri_encode("wal/2026/11/22/20/1-az a-1-x.wal") == "wal/2026/11/22/20/1-az%20a-1-x.wal"
    assert uri_encode("a~b_c-d.e") == "a~b_c-d.e"
    assert uri_encode("ü+=&?#%") == "%C3%BC%2B%3D%26%3F%23%25"
    assert uri_encode("a/b", slash=False) == "a%2Fb"


@given(st.text())
def test_uri_encode_leaves_only_unreserved_characters(text: str) -> None:
    from urllib.parse import unquote

    encoded = uri_encode(text, slash=False)
    assert unquote(encoded) == text
    assert all(c.isascii() and (c.isalnum() or c in "-_.~%") for c in encoded)
