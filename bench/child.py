"""One measurement in a fresh process: `python -m bench.child NAME JSON_ARGS`.

Patched by gevent first, as a gunicorn gevent worker is. Log lines (ours at
INFO, as deployed, and huey's) go to the file named by `log`, not a pipe the
parent would have to drain. The result is one JSON line on stdout.

A peer whose library runs its own asyncio loop (procrastinate's and
pgqueuer's workers) runs unpatched, as it is meant to.
"""

import sys

from mealquest.gevent_patching import patch_all

UNPATCHED = frozenset({"pg_procrastinate", "pg_pgqueuer", "pg_awa", "pg_awa_schema"})

if sys.argv[1:2] and sys.argv[1] in UNPATCHED:
    pass
else:
    patch_all()

import json  # noqa: E402


def main() -> None:
    from bench import (
        claims,
        enqueue,
        enqueue_parts,
        fairness,
        freeze,
        latency,
        memory,
        pg_throughput,
        throughput,
    )

    functions = {
        **throughput.CHILDREN,
        **enqueue.CHILDREN,
        **enqueue_parts.CHILDREN,
        **latency.CHILDREN,
        **freeze.CHILDREN,
        **claims.CHILDREN,
        **fairness.CHILDREN,
        **memory.CHILDREN,
        **pg_throughput.CHILDREN,
    }
    name, args = sys.argv[1], json.loads(sys.argv[2])
    if args.get("log"):
        sys.stderr = open(args["log"], "a", buffering=1)  # noqa: SIM115 - for the process's life
    result = functions[name](args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
