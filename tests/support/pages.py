"""A real HTTP server on loopback serving pages the tests write, counting hits per path.

It runs in its own OS thread (the tests' process is not monkey-patched), so
the job pool's gevent sockets talk to it over real TCP.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    # Send the headers and this many bytes of the body, then wait on `stall`
    # (or until the server stops) before sending the rest.
    stall_after: int | None = None
    stall: threading.Event | None = None
    # Omit Content-Length (the body ends when the connection closes).
    no_length: bool = False
    # Answer nothing, not even the status line, until this is set (or the
    # server stops): the request stays in flight.
    hold: threading.Event | None = None


def recipe_page(title: str = "Tomato Soup", **extra: Any) -> bytes:
    """An HTML page with a JSON-LD schema.org Recipe."""
    recipe = {
        "@context": "https://schema.org",
        "@type": "Recipe",
        "name": title,
        "author": {"@type": "Person", "name": "Ann Cook"},
        "image": ["/images/soup.jpg"],
        "recipeYield": "4",
        "totalTime": "PT1H5M",
        "recipeIngredient": ["4 tomatoes", "1 onion", "500 ml stock"],
        "recipeInstructions": [
            {"@type": "HowToStep", "text": "Chop the tomatoes and the onion."},
            {"@type": "HowToStep", "text": "Simmer in the stock for an hour."},
        ],
        **extra,
    }
    return (
        "<!doctype html><html><head><title>A recipe</title>"
        f'<script type="application/ld+json">{json.dumps(recipe)}</script>'
        "</head><body><h1>A recipe</h1></body></html>"
    ).encode()


# A week's recipes, each with the ingredient lines its site published (BBC
# Good Food, Budget Bytes, Allrecipes; as recipe-scrapers' test pages hold
# them): what the shopping list reads, in the units and styles sites write.
WEEK = {
    "Summer meatballs & spaghetti": [
        "2 tbsp olive oil",
        "1 onion finely chopped",
        "2 garlic cloves crushed",
        "1 tsp fennel seeds",
        "250g pork mince",
        "large handful parsley leaves chopped, stalks finely chopped",
        "1 large courgette peeled into ribbons all around the edge, "
        "centre grated or finely chopped",
        "200g spaghetti",
        "½ a lemon zested and juiced",
        "grated parmesan to serve",
    ],
    "Smash Burgers": [
        "1 lb ground beef ($6.99)",
        "4 Tbsp frozen salted butter, divided ($0.56)",
        "3 tsp Homemade Burger Seasoning ($0.33)",
        "4 burger buns ($2.99)",
        "4 leaves iceberg lettuce ($0.37)",
        "1 tomato, sliced into thin rounds ($0.45)",
        "1/4 small red onion, sliced into thin rounds ($0.16)",
    ],
    "Four Cheese Margherita Pizza": [
        "0.25 cup olive oil",
        "1 tablespoon minced garlic",
        "0.5 teaspoon sea salt",
        "8 Roma tomatoes, sliced",
        "2 (12 inch) pre-baked pizza crusts",
        "8 ounces shredded Mozzarella cheese",
        "4 ounces shredded Fontina cheese",
        "10 fresh basil leaves, washed, dried",
        "0.5 cup freshly grated Parmesan cheese",
        "0.5 cup crumbled feta cheese",
    ],
}


def week_page(title: str) -> bytes:
    """The page of one of `WEEK`'s recipes."""
    return recipe_page(title, recipeIngredient=WEEK[title])


MICRODATA_PAGE = b"""<!doctype html><html><body>
<div itemscope itemtype="https://schema.org/Recipe">
  <h1 itemprop="name">Pancakes</h1>
  By <span itemprop="author">Bob Baker</span>
  <meta itemprop="totalTime" content="PT20M">
  <span itemprop="recipeYield">8 pancakes</span>
  <img itemprop="image" src="https://images.example/pancakes.jpg" alt="">
  <ul>
    <li itemprop="recipeIngredient">2 eggs</li>
    <li itemprop="recipeIngredient">1 cup flour</li>
  </ul>
  <div itemprop="recipeInstructions">Whisk everything, then fry.</div>
</div>
</body></html>"""

NO_RECIPE_PAGE = (
    b'<!doctype html><html><head><meta property="og:title" content="My blog">'
    b"</head><body><h1>Nothing to cook here</h1></body></html>"
)


class PageServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.replies: dict[str, list[Reply]] = {}
        self.hits: Counter[str] = Counter()
        self.requests: list[dict[str, str]] = []
        # Requests that arrived and are not yet answered, and the most at once.
        self.in_flight = 0
        self.most_in_flight = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def url(self, path: str, host: str | None = None) -> str:
        host = host or (f"[{self.host}]" if ":" in self.host else self.host)
        return f"http://{host}:{self.port}{path}"

    def add(self, path: str, *replies: Reply) -> None:
        """Serve `replies` to the successive requests for `path`; the last one repeats."""
        self.replies[path] = list(replies)

    def page(self, path: str, body: bytes, **options: Any) -> None:
        self.add(path, Reply(body=body, **options))

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.add(path, Reply(status=status, headers={"Location": location}))

    @property
    def total_hits(self) -> int:
        return sum(self.hits.values())

    def _arrived(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def _answering(self) -> None:
        """Counted out before the answer is written, so that no client can
        have it while its request still counts."""
        with self._lock:
            self.in_flight -= 1

    def _next_reply(self, path: str, headers: dict[str, str]) -> Reply | None:
        with self._lock:
            count = self.hits[path]
            self.hits[path] += 1
            self.requests.append({"path": path, **headers})
        replies = self.replies.get(path)
        if not replies:
            return None
        return replies[min(count, len(replies) - 1)]


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler_for(server: PageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server._arrived()
            path = urlsplit(self.path).path
            try:
                reply = server._next_reply(path, {k.lower(): v for k, v in self.headers.items()})
                if reply is None:
                    reply = Reply(status=404, body=b"not here")
                if reply.hold is not None:
                    while not reply.hold.wait(0.05) and not server.stopping.is_set():
                        pass
            finally:
                server._answering()
            # The client may give up mid-body (a size cap, a timeout): expected.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._send(reply)

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            if not reply.no_length:
                self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if reply.stall_after is None:
                self.wfile.write(reply.body)
                return
            self.wfile.write(reply.body[: reply.stall_after])
            self.wfile.flush()
            stall = reply.stall or server.stopping
            while not stall.wait(0.05) and not server.stopping.is_set():
                pass
            self.wfile.write(reply.body[reply.stall_after :])

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
