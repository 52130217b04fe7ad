"""Production serving, in parts named for where each runs.

* `middleware`: the app side, in every process that serves HTTP: trusted
  proxy headers and request ids.
* `preflight`: gunicorn's master, before it binds or forks: refuses to
  start on a database the code cannot serve, or on a bad configuration.
* `worker`: each gunicorn worker, from `post_worker_init` to `worker_exit`:
  starts the job pool, drains it when the worker stops serving.
* `work` and `blocked_exit`: `flask jobs work`, a process that runs a job
  pool without serving HTTP, and the native watchdog that ends it when its
  event loop stays blocked.

`gunicorn.conf.py` imports `preflight` only in a child process and `worker`
only inside its hooks, in the worker, once gevent has monkey-patched.
"""

from __future__ import annotations

from typing import Any

from flask import Flask


def flask_app(wsgi: Any) -> Flask:
    """The Flask app gunicorn loaded (our hooks need its config and services)."""
    if not isinstance(wsgi, Flask):
        raise TypeError("the gunicorn app must be the Flask app from create_app()")
    return wsgi
