"""DeleteRecords on a topic whose cleanup.policy lacks delete (compact alone) is POLICY_VIOLATION, as
Kafka's Partition.deleteRecordsOnLeader: such a topic keeps the latest record of every key, however
old, and its readers (changelogs, Connect's config and offset topics) rely on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kio.schema.errors import ErrorCode
from test_follower_reads import Pair, client_header, pairs  # noqa: F401
from test_forwarded_list_offsets import _delete_records_request

from diskless.protocol import messages as m


async def test_delete_records_on_a_compact_only_topic_is_a_policy_violation(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    from diskless.broker.admin_apis import AdminApis

    pair = pairs(leader_end=20, follower_end=20)
    plog = pair.leader_part.log
    plog.update_config(dataclasses.replace(plog.config, cleanup_policy="compact"))
    admin = AdminApis(pair.leader)  # type: ignore[arg-type]
    answer = await admin.delete_records(client_header(m.API_DELETE_RECORDS, 2), _delete_records_request(5))
    entry = answer["topics"][0]["partitions"][0]
    assert entry["error_code"] == ErrorCode.policy_violation
    assert plog.log_start_offset == 0
    plog.update_config(dataclasses.replace(plog.config, cleanup_policy="compact,delete"))
    # The answer waits for every live follower's log start (DelayedDeleteRecords); this pair's
    # follower does not fetch on its own, so it is taken as having reported the new start.
    for progress in pair.leader_part.leader_state.followers.values():
        progress.log_start_offset = 5
    answer = await admin.delete_records(client_header(m.API_DELETE_RECORDS, 2), _delete_records_request(5))
    assert answer["topics"][0]["partitions"][0]["error_code"] == ErrorCode.none
    assert plog.log_start_offset == 5
