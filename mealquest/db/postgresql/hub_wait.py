"""psycopg's waits for the server as gevent's own: an I/O watcher on the hub.

Under gevent, psycopg waits for its socket through the patched `select.poll`
(see `waiting`), which builds a poll object, a watcher per descriptor and a
timer for each wait: about a tenth of a one-row statement's client CPU, on
every statement of every process. A connection of this class
waits on the hub directly, by watching its socket for what psycopg asks for;
everything else (a wait with a timeout, an interrupt, the connection's
cancel) is psycopg's own `Connection.wait`.

Imported only once gevent has patched the standard library: it imports
psycopg (see `waiting`).
"""

from __future__ import annotations

from typing import Any

import psycopg
from gevent.hub import Waiter, get_hub
from psycopg.abc import PQGen
from psycopg.waiting import Ready


def _on_the_hub(gen: PQGen[Any], fileno: int) -> PQGen[Any]:
    """`gen`, its every wait for the socket made on gevent's hub: a generator
    that yields nothing, so psycopg's own wait finds it done at once."""
    yield from ()
    hub = get_hub()
    try:
        wait = next(gen)
        while True:
            # Wait's values are the selectors' events, which are libev's.
            watcher = hub.loop.io(fileno, int(wait))
            waiter: Waiter = Waiter(hub)
            watcher.start(waiter.switch, pass_events=True)
            try:
                events = waiter.get()
            finally:
                watcher.stop()
                watcher.close()
            wait = gen.send(Ready(events & Ready.RW))
    except StopIteration as done:
        return done.value


class HubConnection(psycopg.Connection[dict[str, Any]]):
    """A connection whose waits without a timeout are made on gevent's hub."""

    def wait(self, gen: PQGen[Any], interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None:
            return super().wait(gen, interval, timeout)
        return super().wait(_on_the_hub(gen, self.pgconn.socket), interval, timeout)
