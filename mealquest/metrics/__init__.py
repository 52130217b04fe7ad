"""Prometheus metrics: what the runner and the HTTP layer count, and the scrape.

`registry` defines the metrics and renders a scrape (the runner counts its
attempts, stops and rescues through `mealquest.jobs.runner.metrics`);
`http` counts requests by URL rule; `view` serves
`GET /metrics` to operators; `standalone` serves it on a port of its own for
`flask jobs work`.
"""
