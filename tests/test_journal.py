"""The append-only journal: real segment files in tmp_path, torn tails, corruption, kill -9."""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from small_disk import fill, small_filesystem

from replaygpu.errors import ConfigError, ReplayError
from replaygpu.service.server.journal import Journal, JournalConfig
from replaygpu.service.server.journal_files import (
    HEADER_BYTES,
    JournalCorruptError,
    JournalError,
    JournalFullError,
    segment_name,
)

REPO = Path(__file__).resolve().parents[1]


def payload(n: int, size: int) -> bytes:
    """Record ``n``: its number, then ``size`` bytes that depend on it."""
    return n.to_bytes(4, "little") + random.Random(n).randbytes(size)


def cheap_payload(n: int, size: int) -> bytes:
    """Record ``n`` as the kill -9 child writes it."""
    return n.to_bytes(4, "little") + (n.to_bytes(4, "little") * (size // 4 + 1))[:size]


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal-*.log"))


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_round_trip_across_rotations_in_write_order(tmp_path):
    sizes = [0, 1, 10, 300, 5000, 40, 20_000, 7, 1000, 64]
    records = [payload(n, size) for n, size in enumerate(sizes)]
    with Journal(tmp_path, JournalConfig(segment_bytes=4096)) as journal:
        for start in range(0, len(records), 3):  # rounds of 3 records, one sync each
            journal.append(records[start : start + 3])
            journal.sync()
        assert list(journal.replay()) == records
        assert journal.segments == len(segment_files(tmp_path)) > 3
        framed = sum(len(r) + HEADER_BYTES for r in records)
        assert journal.nbytes == framed
    with Journal(tmp_path, JournalConfig(segment_bytes=4096)) as journal:
        assert list(journal.replay()) == records
        assert journal.truncated_bytes == 0
        journal.append([b"after reopen"])
        journal.sync()
    with Journal(tmp_path) as journal:
        assert list(journal.replay()) == [*records, b"after reopen"]


def test_records_larger_than_a_segment_get_one_of_their_own(tmp_path):
    records = [b"a" * 100, b"b" * 10_000, b"c" * 100]
    with Journal(tmp_path, JournalConfig(segment_bytes=1024)) as journal:
        journal.append(records)
        journal.sync()
        assert journal.segments == 3
    sizes = [path.stat().st_size for path in segment_files(tmp_path)]
    assert sizes == [len(r) + HEADER_BYTES for r in records]


def test_append_accepts_bytes_likes_and_rejects_others_writing_nothing(tmp_path):
    with Journal(tmp_path) as journal:
        journal.append([bytearray(b"ab"), memoryview(b"cd"), b"ef"])
        with pytest.raises(ConfigError, match="record 1 is str"):
            journal.append([b"ok", "not bytes"])
        journal.sync()
        assert list(journal.replay()) == [b"ab", b"cd", b"ef"]
    with pytest.raises(ConfigError, match="segment_bytes"):
        JournalConfig(segment_bytes=0)
    with pytest.raises(ConfigError, match="expected JournalConfig"):
        Journal(tmp_path / "other", config={"segment_bytes": 10})


def test_a_closed_journal_refuses_use(tmp_path):
    journal = Journal(tmp_path)
    journal.close()
    journal.close()  # idempotent
    for call in (lambda: journal.append([b"x"]), journal.sync, lambda: list(journal.replay())):
        with pytest.raises(JournalError, match="is closed"):
            call()


@pytest.mark.parametrize("last_size", [0, 37])
def test_torn_tail_at_every_byte_offset_of_the_last_record_is_truncated(
    tmp_path, caplog, last_size
):
    records = [payload(n, 50 + n) for n in range(5)] + [payload(99, last_size)]
    original = tmp_path / "original"
    with Journal(original) as journal:
        journal.append(records[:-1])
        journal.sync()
        start = journal.nbytes
        journal.append(records[-1:])
        journal.sync()
        end = journal.nbytes
    data = (original / segment_name(1)).read_bytes()
    assert len(data) == end
    for cut in range(start, end):
        directory = tmp_path / f"cut-{cut}"
        directory.mkdir()
        (directory / segment_name(1)).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING), Journal(directory) as journal:
            assert journal.truncated_bytes == cut - start
            assert list(journal.replay()) == records[:-1]
            journal.append([b"appended after the cut"])
            journal.sync()
        assert ("torn tail" in caplog.text) == (cut > start)
        with Journal(directory) as journal:
            assert list(journal.replay()) == [*records[:-1], b"appended after the cut"]
            assert journal.truncated_bytes == 0


@pytest.mark.parametrize(
    "tail",
    [bytes(4096), os.urandom(3000), b"RGJ1" + bytes(60)],
    ids=["zeros", "garbage", "magic-then-zeros"],
)
def test_junk_after_the_last_synced_record_is_a_torn_tail(tmp_path, caplog, tail):
    records = [payload(n, 100) for n in range(4)]
    with Journal(tmp_path) as journal:
        journal.append(records)
        journal.sync()
    with (tmp_path / segment_name(1)).open("ab") as file:
        file.write(tail)
    with caplog.at_level(logging.WARNING), Journal(tmp_path) as journal:
        assert journal.truncated_bytes == len(tail)
        assert list(journal.replay()) == records
    assert "torn tail" in caplog.text


def test_checksum_failure_in_the_last_record_is_truncated_as_a_torn_tail(tmp_path, caplog):
    records = [payload(n, 100) for n in range(4)]
    with Journal(tmp_path) as journal:
        journal.append(records)
        journal.sync()
        size = journal.nbytes
    flip_byte(tmp_path / segment_name(1), size - 10)
    with caplog.at_level(logging.WARNING), Journal(tmp_path) as journal:
        assert journal.truncated_bytes == len(records[-1]) + HEADER_BYTES
        assert list(journal.replay()) == records[:-1]
    assert "checksum" in caplog.text


@pytest.mark.parametrize("where", ["payload", "length", "magic"])
def test_corruption_in_the_middle_of_the_last_segment_raises_naming_file_and_offset(
    tmp_path, where
):
    records = [payload(n, 100) for n in range(4)]
    with Journal(tmp_path) as journal:
        journal.append(records)
        journal.sync()
    second = len(records[0]) + HEADER_BYTES
    flip_byte(tmp_path / segment_name(1), second + {"payload": 50, "length": 5, "magic": 0}[where])
    before = (tmp_path / segment_name(1)).read_bytes()
    with pytest.raises(JournalCorruptError) as caught:
        Journal(tmp_path)
    assert caught.value.offset == second
    assert caught.value.path == tmp_path / segment_name(1)
    assert f"{segment_name(1)} is corrupt at byte offset {second}" in str(caught.value)
    assert isinstance(caught.value, ReplayError)
    assert (tmp_path / segment_name(1)).read_bytes() == before  # nothing truncated
    with pytest.raises(JournalCorruptError):  # not ConfigError: the failed open left no lock
        Journal(tmp_path)


def test_corruption_in_an_earlier_segment_raises_from_replay(tmp_path):
    records = [payload(n, 100) for n in range(6)]
    with Journal(tmp_path, JournalConfig(segment_bytes=3 * (104 + HEADER_BYTES))) as journal:
        journal.append(records)
        journal.sync()
    first = segment_files(tmp_path)[0]
    flip_byte(first, first.stat().st_size - 1)  # its last record: no torn tail outside the last
    with Journal(tmp_path) as journal:
        replayed = []
        with pytest.raises(JournalCorruptError, match=segment_name(1)) as caught:
            replayed.extend(journal.replay())
    assert replayed == records[:2]
    assert caught.value.offset == 2 * (104 + HEADER_BYTES)


def test_a_missing_segment_between_others_raises(tmp_path):
    with Journal(tmp_path, JournalConfig(segment_bytes=64)) as journal:
        journal.append([payload(n, 100) for n in range(3)])
        journal.sync()
    (tmp_path / segment_name(2)).unlink()
    with pytest.raises(JournalCorruptError, match="missing"):
        Journal(tmp_path)


def test_checkpointed_keeps_the_segments_of_the_previous_checkpoint(tmp_path):
    first = [payload(n, 1000) for n in range(10)]
    second = [payload(n, 1000) for n in range(10, 13)]
    third = [payload(n, 1000) for n in range(13, 15)]
    with Journal(tmp_path, JournalConfig(segment_bytes=4096)) as journal:
        journal.append(first)
        journal.sync()
        assert journal.segments > 2
        before = journal.segments
        # checkpoint 1 holds `first`: nothing is deleted, no checkpoint came before it
        assert journal.checkpointed() == 0
        assert journal.segments == before + 1 and journal.segment == before + 1
        journal.append(second)
        journal.sync()
        # checkpoint 2 holds `second` too: what only checkpoint 1 needed goes; `second`
        # stays, so that checkpoint 1 plus the journal still restore everything
        assert journal.checkpointed() == before
        assert list(journal.replay()) == second
        journal.append(third)
        journal.sync()
        assert journal.checkpointed() == 1
        assert list(journal.replay()) == third
    with Journal(tmp_path) as journal:
        assert list(journal.replay()) == third


def test_checkpointed_with_a_mark_keeps_what_was_appended_after_the_mark(tmp_path):
    with Journal(tmp_path) as journal:
        journal.append([b"in checkpoint 1"])
        journal.checkpointed()
        journal.append([b"in checkpoint 2"])
        mark = journal.rotate()  # in the commit-exclusive section, before the save
        journal.append([b"after the snapshot"])  # commits resumed while the save finished
        journal.sync()
        assert journal.checkpointed(mark) == 1
        assert list(journal.replay()) == [b"in checkpoint 2", b"after the snapshot"]
        with pytest.raises(ConfigError, match="expected an int <="):
            journal.checkpointed(mark + 5)
        assert journal.rotate() == mark + 1
        assert journal.rotate() == mark + 1  # an empty segment is not rotated


def test_resume_after_keeps_the_restored_checkpoints_segments_and_refuses_a_gap(tmp_path):
    with Journal(tmp_path) as journal:
        journal.append([b"a"])
        mark = journal.rotate()  # checkpoint A covers segment 1
        journal.append([b"b"])
        journal.sync()
    with Journal(tmp_path) as journal:  # restarted from A
        journal.resume_after(mark)
        journal.append([b"c"])
        assert journal.checkpointed() == 1  # A was the previous checkpoint: segment 1 goes
        assert list(journal.replay()) == [b"b", b"c"]
    (tmp_path / segment_name(mark)).unlink()  # lost: a restart from A would miss "b", "c"
    kept = segment_files(tmp_path)
    gap = f"needs {segment_name(mark)} and later"
    with Journal(tmp_path) as journal, pytest.raises(JournalError, match=gap):
        journal.resume_after(mark)
    assert segment_files(tmp_path) == kept  # nothing was changed


def test_checkpointed_from_another_thread_loses_nothing_appended_after_it(tmp_path):
    stop = threading.Event()
    appended: list[int] = []
    journal = Journal(tmp_path, JournalConfig(segment_bytes=8192))

    def commit_rounds() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            journal.append([payload(n, 500)])
            journal.sync()
            appended.append(n)

    committer = threading.Thread(target=commit_rounds)
    committer.start()
    try:
        for _ in range(20):  # each after a commit round since the last one (20 rotations)
            seen, deadline = len(appended), time.monotonic() + 30
            while len(appended) == seen:
                assert time.monotonic() < deadline, "the committer appended nothing in 30 s"
                time.sleep(0.001)
            journal.checkpointed()
    finally:
        stop.set()
        committer.join()
    replayed = [int.from_bytes(r[:4], "little") for r in journal.replay()]
    journal.close()
    assert replayed == appended[len(appended) - len(replayed) :]  # a suffix, ending at the last
    assert len(replayed) < len(appended)


def test_a_second_journal_on_the_same_directory_is_refused(tmp_path):
    holder = f"in use by another journal \\(process {os.getpid()}\\)"
    with Journal(tmp_path), pytest.raises(ConfigError, match=holder):
        Journal(tmp_path)
    with Journal(tmp_path) as journal:  # free again once closed
        journal.append([b"x"])


FILE_LIMIT_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from replaygpu.service.server.journal import Journal, JournalError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    journal = Journal(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
    synced = 0
    try:
        while True:
            journal.append([bytes([synced]) * 30_000])
            journal.sync()
            synced += 1
    except JournalError as exc:
        print(synced, "synced;", type(exc).__name__, exc)
    journal.append([b"fits"])  # the next call cuts the torn record off and goes on
    journal.sync()
    print("then: appended")
    """
)


def test_a_failed_write_fails_that_call_and_the_next_one_recovers_by_itself(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", FILE_LIMIT_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    first, then = done.stdout.splitlines()
    assert first.startswith("3 synced; JournalError") and "File too large" in first
    assert then == "then: appended"
    with Journal(tmp_path) as journal:  # the fourth record, cut short at the limit, is gone
        assert journal.truncated_bytes == 0
        assert list(journal.replay()) == [bytes([n]) * 30_000 for n in range(3)] + [b"fits"]


def test_a_full_disk_refuses_appends_until_space_is_freed(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        journal = Journal(disk / "journal")
        try:
            journal.append([payload(0, 1000)])
            journal.sync()
            filler = fill(disk, leave=50_000)
            synced = [payload(0, 1000)]
            with pytest.raises(JournalFullError) as full:
                for n in itertools.count(1):
                    journal.append([payload(n, 20_000)])
                    journal.sync()
                    synced.append(payload(n, 20_000))
            message = str(full.value)
            assert f"journal {disk / 'journal'}: its file system is full" in message
            needed = len(payload(0, 20_000)) + HEADER_BYTES
            assert re.search(rf"\d+ bytes free of \d+, {needed} needed", message), message
            assert "No space left on device" in message
            for _ in range(3):  # refused while full, one warning for the whole outage
                with pytest.raises(JournalFullError):
                    journal.append([payload(99, 20_000)])
                assert journal.check() is not None
            assert sum("file system is full" in r.message for r in caplog.records) == 1
            filler.unlink()
            assert journal.check() is None  # recovered by itself, no reopening
            assert any("appends resume" in r.message for r in caplog.records)
            journal.append([b"after"])
            journal.sync()
            assert list(journal.replay()) == [*synced, b"after"]
        finally:
            journal.close()


CHILD = textwrap.dedent(
    """
    import itertools, sys
    from replaygpu.service.server.journal import Journal, JournalConfig

    def payload(n, size):  # cheap_payload: most of the time goes to write and sync
        return n.to_bytes(4, "little") + (n.to_bytes(4, "little") * (size // 4 + 1))[:size]

    first = int(sys.argv[2])
    with Journal(sys.argv[1], JournalConfig(segment_bytes=8 << 20)) as journal:
        n = first
        for round_ in itertools.count():
            sizes = [(10, 5000, 300_000, 6_000_000)[(n + i) % 4] for i in range(1 + round_ % 4)]
            journal.append([payload(n + i, size) for i, size in enumerate(sizes)])
            journal.sync()
            n += len(sizes)
            print(n, flush=True)  # records first .. n-1 are synced
    """
)


def test_every_record_synced_before_a_kill_9_is_replayed(tmp_path):
    rng = random.Random(0)
    expected: list[bytes] = []  # every record from earlier children that replayed
    for attempt in range(8):  # about 1 in 4 kills lands mid-write and leaves a torn tail
        first = int.from_bytes(expected[-1][:4], "little") + 1 if expected else 0
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(first)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert child.stdout is not None
        lines = []
        for _ in range(rng.randint(2, 8)):
            lines.append(child.stdout.readline())
            assert lines[-1], f"the child exited early (attempt {attempt})"
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        lines += child.stdout.read().split()  # syncs reported before the kill landed
        child.wait()
        assert child.returncode == -signal.SIGKILL
        synced = int(lines[-1])
        with Journal(tmp_path) as journal:
            replayed = list(journal.replay())
        assert replayed[: len(expected)] == expected
        numbers = [int.from_bytes(r[:4], "little") for r in replayed[len(expected) :]]
        assert numbers == list(range(first, first + len(numbers)))  # in order, none missing
        assert first + len(numbers) >= synced  # every reported record is there
        for record, n in zip(replayed[len(expected) :], numbers, strict=True):
            assert record == cheap_payload(n, len(record) - 4)  # none corrupt
        expected = replayed
    assert len(segment_files(tmp_path)) > 1
