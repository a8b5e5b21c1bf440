"""A tensorwire.ipc server for the tests, run as a separate process:
``python ipc_server.py SOCKET [extra env-gated mode]``. Prints ``ready`` once serving.
"""

import os
import sys
import threading
import time

import numpy as np

from tensorwire import ipc

builds = {"slow": 0}
_lock = threading.Lock()
# The server main() runs, for endpoints that wait on its counters.
_served = {}
# Opened by the `open_gate` endpoint; `held` tasks wait for it.
_gate = threading.Event()


def endpoints(provider):
    @provider.share(managed=True, cache_format_key="table:{n}")
    def table(n: int = 4):
        return {"x": np.arange(n, dtype=np.float32), "n": n}

    @provider.share(cache=False)
    def echo(*args, **kwargs):
        if kwargs:
            return args, kwargs
        return args[0] if len(args) == 1 else args

    # `shared(n)` keeps an array allocated in shared memory; `peek_shared(n)` reads it
    # as the server sees it now (clients write into the very same memory).
    kept = {}

    @provider.share(managed=True, cache_format_key="shared:{n}")
    def shared(n: int = 4):
        kept[n] = ipc.empty(n, np.float32)
        return {"x": kept[n]}

    @provider.share(cache=False)
    def peek_shared(n: int = 4):
        return float(kept[n][0])

    @provider.share()
    def slow(k: int, waiters: int = 0):
        """``k * 2``, built once ``waiters`` other callers wait on this build (up to
        30 s; a plain 0.4 s without a server to ask, or with no waiters named)."""
        with _lock:
            builds["slow"] += 1
        server = _served.get("server")
        if server is None or not waiters:
            time.sleep(0.4)
            return k * 2
        deadline = time.monotonic() + 30
        while (dict(server.info()["counters"])["singleflight_waits"] < waiters
               and time.monotonic() < deadline):
            time.sleep(0.01)
        return k * 2

    @provider.share(cache=False)
    def slow_builds():
        return builds["slow"]

    @provider.share(execution="task", cache=False)
    def build(ms: int):
        time.sleep(ms / 1000)
        if ms == 13:
            raise ValueError("unlucky thirteen")
        return np.full(4, ms, dtype=np.int64)

    @provider.share(execution="task", cache=False)
    def held(ms: int):
        """A task that ends (answering like ``build``) once ``open_gate`` is called,
        at most 60 s on."""
        _gate.wait(60)
        return np.full(4, ms, dtype=np.int64)

    @provider.share(cache=False)
    def open_gate():
        _gate.set()

    @provider.share(cache=False)
    def fails():
        raise KeyError("no such thing")

    @provider.share(cache=False)
    def unshareable():
        return {1, 2, 3}

    @provider.share(cache_format_key="key:{missing}")
    def badly_keyed(n: int):
        return n

    return provider


def main():
    socket_path = sys.argv[1]
    provider = endpoints(ipc.Provider(execution_mode="server", socket_path=socket_path,
                                      autostart=False))
    server = ipc.Server(provider, task_workers=1)
    server.start()
    _served["server"] = server
    print("ready", server.server_id, flush=True)
    while server.running:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
