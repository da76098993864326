"""A sink that collects what the serving loop (``deploy/triton/serving.py``) sends one request, for the tests."""

from __future__ import annotations

import threading


class CollectingSink:
    """The token ids of every response (``ids``), the error (``err``), and ``done`` once the last one came."""

    def __init__(self):
        self.ids, self.done, self.err = [], threading.Event(), None

    def send(self, tensors, final):
        self.ids += [int(t) for t in tensors["output_ids"].reshape(-1)]
        if final:
            self.done.set()

    def error(self, message):
        self.err = message
        self.done.set()

    def cancelled(self):
        return False
