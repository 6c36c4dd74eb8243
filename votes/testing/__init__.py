"""Test and operator tooling, outside the request path: the arena run as real processes on
loopback (``stack``) and the websocket voters of the load test (``voters``). The fault, load and
browser tests use them, and so does ``manage.py loadtest``; no view, consumer or task does."""
