"""Load generators for the HTTP figure: wrk when installed, else a small Python one.

Both hold `connections` keep-alive connections on loopback for a bounded time
and report requests per second, the 99th percentile latency and how many
answers were not 2xx (a non-200 answer would make a route look cheap). A
socket error (a connection refused, reset or timed out) fails the figure:
requests that never got an answer would make the rate a fiction.
The Python generator is slower than wrk and saturates the server less, but
the figure is a ratio of two routes driven the same way, so it stays
comparable; the table says which generator ran.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.common import percentile

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
# An access line's request and status, in the text and the JSON format (gunicorn.conf.py).
_ACCESS = re.compile(r'"((?:GET|POST|PUT|PATCH|DELETE|HEAD) [^"]*)" (\d{3}) |"status": "(\d{3})"')
_LINES_SHOWN = 20


def answers_not_ok(server_log: Path) -> str:
    """Why a run counted answers that were not 2xx, from the server's own log:
    how many of each status it wrote (by request where its format names
    it), and its last lines that are not access lines (a warning or error
    says what refused them). For the error a figure fails with: the load
    generator counts such answers but cannot say which they were."""
    statuses: Counter[str] = Counter()
    others: list[str] = []
    for line in server_log.read_text(errors="replace").splitlines():
        access = _ACCESS.search(line)
        if access is None:
            others.append(line)
            continue
        status = access.group(2) or access.group(3)
        if not status.startswith("2"):
            request = access.group(1) or "?"
            statuses[f"{status} {request.rsplit(' ', 1)[0]}"] += 1
    counted = ", ".join(f"{what}: {count}" for what, count in statuses.most_common()) or "none"
    return f"answers not 2xx in the server's log: {counted}\n" + "\n".join(others[-_LINES_SHOWN:])


class LoadError(RuntimeError):
    """The load generator's connections failed: the run measured nothing."""


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    url: str, headers: dict[str, str], seconds: float, connections: int, body: str | None = None
) -> dict:
    args = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        if body is not None:
            # A POST of `body`: wrk takes the method and body from a Lua script.
            script.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n')
            script.flush()
            args += ["-s", script.name]
        output = subprocess.run(
            [*args, url], capture_output=True, text=True, check=True, timeout=seconds + 60
        ).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    # "Socket errors: connect 0, read 2, write 0, timeout 0", printed only when one happened.
    errors = re.search(r"Socket errors:.*", output)
    if errors and any(int(count) for count in re.findall(r"\d+", errors.group(0))):
        raise LoadError(f"wrk against {url}: {errors.group(0)}")
    if not rate or not p99:
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    return {
        "requests_per_s": float(rate.group(1)),
        "p99_ms": float(p99.group(1)) * _UNITS[p99.group(2)],
        "non_200": int(bad.group(1)) if bad else 0,
        "generator": "wrk",
    }


def run_python(
    url: str, headers: dict[str, str], seconds: float, connections: int, body: str | None = None
) -> dict:
    match = re.match(r"http://([^:/]+):(\d+)(/.*)", url)
    assert match, url
    host, port, path = match.group(1), int(match.group(2)), match.group(3)
    latencies: list[list[float]] = [[] for _ in range(connections)]
    non_200 = [0] * connections
    failures: list[OSError | http.client.HTTPException] = []
    deadline = time.perf_counter() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                if body is None:
                    conn.request("GET", path, headers=headers)
                else:
                    conn.request("POST", path, body=body.encode(), headers=headers)
                response = conn.getresponse()
                response.read()
                latencies[index].append(time.perf_counter() - started)
                if not 200 <= response.status < 300:
                    non_200[index] += 1
        except (OSError, http.client.HTTPException) as error:
            failures.append(error)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise LoadError(f"{len(failures)} connections to {url} failed: {failures[0]!r}")
    every = [value for values in latencies for value in values]
    return {
        "requests_per_s": len(every) / elapsed,
        "p99_ms": 1000 * percentile(every, 0.99),
        "non_200": sum(non_200),
        "generator": "python",
    }


def run_load(
    url: str,
    headers: dict[str, str],
    seconds: float,
    connections: int,
    generator: str,
    *,
    body: str | None = None,
) -> dict:
    """GET `url`, or POST `body` to it, from `connections` connections for `seconds`."""
    if generator == "wrk":
        return run_wrk(url, headers, seconds, connections, body)
    return run_python(url, headers, seconds, connections, body)
