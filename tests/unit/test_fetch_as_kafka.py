"""Consumer Fetch requests answered as Kafka answers them (found by review; each test failed on the
old code), driven through the real handler of a leader over a real partition log
(``test_follower_reads.Pair``).

- KIP-227 session fields of a sessionless fetch (consumers are kept no sessions, and answered
  session id 0): a full fetch (epoch 0 or -1) that names a session id is served, as Kafka's
  FetchManager closes the named session and serves the fetch; it used to be refused
  FETCH_SESSION_ID_NOT_FOUND. An incremental fetch naming session id 0 is
  FETCH_SESSION_ID_NOT_FOUND (no such session), as in Kafka; it used to be
  INVALID_FETCH_SESSION_EPOCH.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode
from test_follower_reads import (  # noqa: F401 (pairs is a fixture)
    Pair,
    client_header,
    fetch_request,
    offsets_of,
    pairs,
)

from diskless.protocol import messages as m


@pytest.mark.parametrize(
    ("session_id", "epoch", "code"),
    [
        (0, -1, ErrorCode.none),
        (0, 0, ErrorCode.none),
        (12345, 0, ErrorCode.none),
        (12345, -1, ErrorCode.none),
        (0, 3, ErrorCode.fetch_session_id_not_found),
        (12345, 3, ErrorCode.fetch_session_id_not_found),
    ],
)
async def test_session_fields_of_a_consumer_fetch(
    pairs: Callable[..., Pair],  # noqa: F811
    session_id: int,
    epoch: int,
    code: ErrorCode,
) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    request = fetch_request(5)
    request.session_id, request.session_epoch = session_id, epoch
    answer = await pair.leader.fetch_apis.fetch(client_header(m.API_FETCH, 12), request)
    assert (answer["error_code"], answer["session_id"]) == (code, 0)
    if code == ErrorCode.none:
        assert offsets_of(answer["responses"][0]["partitions"][0])[0] == 5
    else:
        assert answer["responses"] == []
