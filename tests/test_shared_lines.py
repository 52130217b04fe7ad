"""The lines jobs of several processes append to one file: each a record
that no page boundary of the file cuts (`tests.support.shared_lines`)."""

from __future__ import annotations

import os

import pytest

from tests.support.shared_lines import RECORD_BYTES, append, record


def test_every_record_fills_a_whole_number_of_a_pages_places(tmp_path):
    path = str(tmp_path / "lines")
    texts = [f"start {'a' * 32} {pid} w.{'b' * 40} 1796638675.1769178" for pid in range(100)]
    for text in texts:
        append(path, text)

    data = (tmp_path / "lines").read_bytes()
    assert 4096 % RECORD_BYTES == 0
    assert len(data) == len(texts) * RECORD_BYTES
    # Each record starts where a page holds a whole number of them: none
    # crosses a page, so a SIGKILL cannot stop its write halfway.
    assert [line.split() for line in data.decode().splitlines()] == [t.split() for t in texts]
    ends = range(RECORD_BYTES, len(data) + 1, RECORD_BYTES)
    assert all(data[end - 1 : end] == b"\n" for end in ends)


@pytest.mark.parametrize("text", ["x" * RECORD_BYTES, "two\nlines"])
def test_a_line_that_does_not_fit_one_record_is_refused(text):
    with pytest.raises(ValueError, match="one line under"):
        record(text)
    # The longest that fits: its newline ends the record.
    assert record("x" * (RECORD_BYTES - 1)) == b"x" * (RECORD_BYTES - 1) + b"\n"


def test_a_process_writes_each_record_in_one_write(tmp_path):
    path = str(tmp_path / "lines")
    append(path, "first")
    size = os.path.getsize(path)
    append(path, "second")
    assert (size, os.path.getsize(path)) == (RECORD_BYTES, 2 * RECORD_BYTES)
