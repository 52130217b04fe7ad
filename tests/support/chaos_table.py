"""The chaos test's published tables: what `scripts/chaos` writes to
`docs/chaos-results.md` from the rows the test appended (one JSON object per
database, `MQ_CHAOS_TABLE`), with the command that measured them, the date
and the machine. The docs' Faults page includes that file: no table is
copied by hand.

`python -m tests.support.chaos_table ROWS COMMAND STATUS OUT`
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

DATABASES = {
    "sqlite": "SQLite",
    "postgresql": "PostgreSQL",
    "pgbouncer": "PostgreSQL through PgBouncer",
}
COUNTS = (
    ("jobs answered", "jobs answered"),
    ("lost", "lost"),
    ("run twice, lease lost with a killed process", "run twice: lease lost with a killed process"),
    (
        "run twice, lease expired while the database was away",
        "run twice: lease expired, the database away (write refused, or claim rescued)",
    ),
    ("run twice, unexplained", "run twice: unexplained"),
    ("runs of jobs never answered", "runs of jobs no client saw answered"),
    ("requests without an answer (retried)", "requests without an answer (retried with their key)"),
)


def machine() -> str:
    """The machine, in the words a reader compares with their own."""
    cores = os.cpu_count() or 0
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            kib = int(meminfo.readline().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    postgres = _postgres_version()
    return (
        f"{platform.system()} {platform.machine()}, {cores} cores{memory}, "
        f"Python {platform.python_version()}" + (f", {postgres}" if postgres else "")
    )


def _postgres_version() -> str | None:
    try:
        done = subprocess.run(
            ["pg_config", "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def render(rows: list[dict[str, Any]], command: str, status: int, *, when: str, on: str) -> str:
    """The Markdown the Faults page includes."""
    verdict = "passed" if status == 0 else f"**failed** (pytest's status {status})"
    seconds = ", ".join(
        f"{DATABASES.get(row['database'], row['database'])} {row.get('seconds', '?')} s"
        for row in rows
    )
    lines = [
        f"Written by `{command}` on {when}, on {on}; the test {verdict} ({seconds}).",
        "",
        "| database | " + " | ".join(title for _key, title in COUNTS) + " | answers |",
        "|---|" + "---|" * (len(COUNTS) + 1),
    ]
    for row in rows:
        answers = ", ".join(f"{code}: {count:,}" for code, count in row["answers"].items())
        counts = " | ".join(_number(row.get(key, "")) for key, _title in COUNTS)
        lines.append(
            f"| {DATABASES.get(row['database'], row['database'])} | {counts} | {answers} |"
        )
    faults: list[str] = []
    for row in rows:
        for fault in row["faults"]:
            if fault not in faults:
                faults.append(fault)
    lines += [
        "",
        "Per fault: how many times it was injected, and the longest time from the fault "
        "until ten more jobs had run (a restart includes the new process's start):",
        "",
        "| fault | " + " | ".join(DATABASES.get(r["database"], r["database"]) for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for fault in faults:
        cells = []
        for row in rows:
            count = row["faults"].get(fault)
            back = row["longest recovery (s)"].get(fault)
            cells.append(f"{count}, back in {back} s" if count else "")
        lines.append(f"| {fault} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    rows_path, command, status, out = argv
    text = Path(rows_path).read_text() if Path(rows_path).exists() else ""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    order = list(DATABASES)
    rows.sort(key=lambda row: order.index(row["database"]) if row["database"] in order else 99)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    Path(out).write_text(render(rows, command, int(status), when=when, on=machine()))


if __name__ == "__main__":
    main(sys.argv[1:])
