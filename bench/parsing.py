"""Recipe parsing in processes: what a warm parser process saves over a cold one.

`python -m bench.parsing [--rounds N] [--size BYTES]`

Each page is parsed in a process of its own (`mealquest.recipes.parser_pool`)
so that a page that parses for ever can be killed. A process costs a fresh
interpreter and the parsing libraries' imports; a warm one (kept by the
pool after its parse) costs only the page. This measures, interleaved, N
rounds of each way of parsing the same two pages (the tests' small JSON-LD
page, and one padded with ordinary markup to SIZE bytes):

* `in_process`: `parse_page` called here (the baseline: what the thread of
  gevent's pool did, with no way to stop it);
* `warm`: `ParserPool(keep=1).parse`, the process kept between parses;
* `cold`: `ParserPool(keep=0).parse`, a new process per parse, ended after it.

For each: wall time per parse (the median) and CPU per parse, this
process's and its children's together (reaped children count in
`RUSAGE_CHILDREN`; the warm process's is read from /proc). Run, like
the other figures, in a process patched by gevent first, as a gunicorn
gevent worker is. Absolute times say something about this run only.
"""

from __future__ import annotations

from mealquest.gevent_patching import patch_all

patch_all()

import argparse  # noqa: E402 - after the patching, as in a gunicorn gevent worker
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from mealquest.recipes.fetch import Page  # noqa: E402
from mealquest.recipes.parse import parse_page  # noqa: E402
from mealquest.recipes.parser_pool import ParserPool  # noqa: E402
from tests.support.pages import recipe_page  # noqa: E402

# What pads a real recipe page: prose, a few tags, and inline scripts.
_FILLER = (
    "<div class='step'><p>Stir the <b>soup</b> now and then, and taste it: "
    + "a pinch of salt, a little pepper, then let it rest for a while. " * 4
    + "<a href='/tips/stirring'>Our tips</a>.</p></div>\n"
    + "<script>window.ads = window.ads || []; ads.push({slot: 'recipe', sizes: [[300, 250]], "
    + "targeting: {section: 'soups', page: 'tomato'}}); "
    + "function track(e) { return e && e.type ? e.type : 'none'; }</script>\n"
)


def pages(size: int) -> dict[str, Page]:
    small = recipe_page()
    padding = (_FILLER * (size // len(_FILLER) + 1))[: max(0, size - len(small))]
    large = small.replace(b"<h1>A recipe</h1>", padding.encode())
    return {
        f"{len(small) / 1024:.0f} KiB": Page("https://recipes.example/a", "text/html", small),
        f"{len(large) / 1024:.0f} KiB": Page("https://recipes.example/b", "text/html", large),
    }


def _cpu_of(pid: int) -> float:
    """A live process's CPU seconds so far (nanoseconds on the CPU, from /proc)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def _cpu(pool: ParserPool | None) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    if pool is not None:
        total += sum(_cpu_of(pid) for pid in pool.idle_pids())
    return total


def timed(parse: Callable[[], object], pool: ParserPool | None) -> tuple[float, float]:
    cpu, wall = _cpu(pool), time.perf_counter()
    parse()
    return time.perf_counter() - wall, _cpu(pool) - cpu


def run(rounds: int, size: int) -> list[dict[str, object]]:
    warm, cold = ParserPool(keep=1), ParserPool(keep=0)
    rows = []
    try:
        for name, page in pages(size).items():
            warm.parse(page, seconds=60)  # started once, before the rounds
            samples: dict[str, list[tuple[float, float]]] = {
                "in_process": [],
                "warm": [],
                "cold": [],
            }
            for _ in range(rounds):
                samples["in_process"].append(timed(lambda page=page: parse_page(page), None))
                samples["warm"].append(timed(lambda page=page: warm.parse(page, seconds=60), warm))
                samples["cold"].append(timed(lambda page=page: cold.parse(page, seconds=60), None))
            for way, measured in samples.items():
                rows.append(
                    {
                        "page": name,
                        "way": way,
                        "wall_ms": statistics.median(w for w, _ in measured) * 1000,
                        "cpu_ms": statistics.median(c for _, c in measured) * 1000,
                    }
                )
    finally:
        warm.stop()
        cold.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--size", type=int, default=300_000)
    args = parser.parse_args()
    rows = run(args.rounds, args.size)
    print("| page | way | wall per parse | CPU per parse | wall vs warm |")
    print("|---|---|---|---|---|")
    warm = {row["page"]: row["wall_ms"] for row in rows if row["way"] == "warm"}
    for row in rows:
        ratio = row["wall_ms"] / warm[row["page"]]  # type: ignore[operator]
        print(
            f"| {row['page']} | {row['way']} | {row['wall_ms']:.1f} ms | {row['cpu_ms']:.1f} ms "
            f"| {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
