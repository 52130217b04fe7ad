"""gunicorn settings for MealQuest (see the README's deployment section).

Imports nothing of ours and opens nothing: this file is read by the master,
and nothing opened before fork may be used after it.
"""

import os

wsgi_app = "wsgi:app"
# gevent workers: one process serves many requests and runs the job pool's greenlets.
worker_class = "gevent"
bind = os.environ.get("MEALQUEST_BIND", "127.0.0.1:8000")
# WEB_CONCURRENCY is read by gunicorn itself; 2 is a fit for a small machine.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# No control socket under the home directory (gunicorn 25.1+ opens one by default).
control_socket_disable = True
