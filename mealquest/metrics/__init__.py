"""Prometheus metrics: what the runner and the HTTP layer count, and the scrape.

`registry` defines the metrics and renders a scrape; `runs` is what the
runner calls when an attempt ends, a stop interrupts jobs or the rescuer
takes jobs back; `http` counts requests by URL rule; `view` serves
`GET /metrics` to operators; `standalone` serves it on a port of its own for
`flask jobs work`.
"""
