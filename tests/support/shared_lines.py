"""Lines that the jobs of several processes append to one file, whole even
when a process is SIGKILLed as it writes.

One `write` to an `O_APPEND` file is not whole under SIGKILL: the kernel
copies a write page by page and stops between two pages once a fatal
signal is pending. Four processes appending 100-byte lines, SIGKILLed at
random 18,808 times, left 25 lines cut short and run into the next, every
cut at a multiple of 4,096 bytes in the file (the chaos test failed on one).
So every line here is one record of `RECORD_BYTES`, padded with spaces: a
page holds a whole number of them and none crosses a page, whatever the
file's length. Readers split lines on whitespace, so the padding is not
seen.
"""

from __future__ import annotations

import os

RECORD_BYTES = 128  # divides 4,096 (and every larger page)


def record(text: str) -> bytes:
    """`text` as one record: padded with spaces to the record's size, then a newline."""
    encoded = text.encode()
    if len(encoded) >= RECORD_BYTES or b"\n" in encoded:
        raise ValueError(f"a line must be one line under {RECORD_BYTES} bytes: {text!r}")
    return encoded.ljust(RECORD_BYTES - 1) + b"\n"


def append(path: str, text: str) -> None:
    """Append `text` as a record to the file at `path` (made if missing)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, record(text))
    finally:
        os.close(fd)
