"""The offline journal: durable, ordered, torn tails ignored, delivered records not resent."""

from __future__ import annotations

import os

from respawn.journal import JOURNAL_NAME, Journal


def drain(journal):
    out = []
    while (entry := journal.next(timeout=0)) is not None:
        out.append(entry.body["n"])
        journal.delivered(entry)
    return out


def test_records_replay_in_order_after_a_restart(tmp_path):
    journal = Journal(str(tmp_path))
    for n in range(5):
        journal.append("heartbeat", {"n": n, "event_id": f"e{n}"})
    first = journal.next(timeout=0)
    journal.delivered(first)
    journal.close()

    reopened = Journal(str(tmp_path))
    entries = []
    while (entry := reopened.next(timeout=0)) is not None:
        entries.append(entry.body)
        reopened.delivered(entry)
    assert [e["n"] for e in entries] == [1, 2, 3, 4]
    assert [e["event_id"] for e in entries] == ["e1", "e2", "e3", "e4"]


def test_a_torn_tail_is_ignored_and_later_records_survive(tmp_path):
    journal = Journal(str(tmp_path))
    journal.append("logs", {"n": 0})
    journal.append("logs", {"n": 1})
    journal.close()
    path = tmp_path / JOURNAL_NAME
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the crash cut the last record short

    reopened = Journal(str(tmp_path))
    reopened.append("logs", {"n": 2})
    reopened.close()
    assert drain(Journal(str(tmp_path))) == [0, 2]


def test_a_corrupted_record_ends_the_readable_journal(tmp_path):
    journal = Journal(str(tmp_path))
    journal.append("logs", {"n": 0})
    journal.append("logs", {"n": 1})
    journal.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a flipped bit in the last record: its checksum no longer matches
    path.write_bytes(bytes(data))
    assert drain(Journal(str(tmp_path))) == [0]


def test_the_journal_is_private_to_the_agent(tmp_path):
    Journal(str(tmp_path / "j")).append("logs", {"n": 0})
    assert os.stat(tmp_path / "j").st_mode & 0o077 == 0


def test_a_fully_delivered_journal_starts_afresh_and_stays_correct(tmp_path, monkeypatch):
    monkeypatch.setattr("respawn.journal.COMPACT_AT_BYTES", 100)
    journal = Journal(str(tmp_path))
    for n in range(5):
        journal.append("logs", {"n": n, "padding": "x" * 40})
    assert drain(journal) == [0, 1, 2, 3, 4]
    assert (tmp_path / JOURNAL_NAME).stat().st_size == 0
    journal.append("logs", {"n": 5})
    journal.close()
    assert drain(Journal(str(tmp_path))) == [5]
