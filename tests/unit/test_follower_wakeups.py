"""A follower wakes the fetches parked on it only when an answer from its leader moved what they
read (a high watermark, a last stable offset): records appended beyond its high watermark are no
news to its readers, and a sessionless consumer's wake-up is a pass over every partition it names."""

from __future__ import annotations

from pathlib import Path

from test_topic_identity import CONFIG, FetchingBroker, now_ms, produce_pointer, replica_fetch_round, replicated

from diskless.replication.fetcher import ReplicaFetcher


async def test_an_answer_wakes_readers_only_when_the_high_watermark_moves(tmp_path: Path) -> None:
    leader_id, follower_id = 0, 1
    leader = FetchingBroker(tmp_path / "leader", leader_id)
    follower = FetchingBroker(tmp_path / "follower", follower_id)
    try:
        meta = replicated("t", leader_id, follower_id)
        leader.metadata.topics["t"] = follower.metadata.topics["t"] = meta
        led = leader.replicas.apply(meta, 0, CONFIG, now_ms())
        followed = follower.replicas.apply(meta, 0, CONFIG, now_ms())
        assert led is not None and followed is not None
        wakes: list[int] = []
        fetcher = ReplicaFetcher(follower_id, leader_id, lambda node: None, 0, 1 << 20, lambda: wakes.append(1))
        fetcher.add(followed)
        produce_pointer(led, "wal/a.wal")  # not committed: the follower has yet to copy it

        await replica_fetch_round(fetcher, followed, leader)
        assert followed.log.log_end_offset == 3 and followed.log.high_watermark == 0
        assert wakes == []  # appended, but nothing its readers may read yet

        await replica_fetch_round(fetcher, followed, leader)  # its fetch at 3 commits them
        assert followed.log.high_watermark == 3
        assert wakes == [1]
    finally:
        await leader.replicas.close()
        await follower.replicas.close()
