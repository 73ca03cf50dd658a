"""Ctrl-C (or SIGTERM) during training as a request to stop between two steps, saving "last";
a second signal aborts at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["stop_on_signals"]


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """Turn the first Ctrl-C (or SIGTERM) into ``request_stop``: a KeyboardInterrupt inside
    ``optimizer.step`` could leave half the weights updated."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: object) -> None:
        # The second signal is not caught: it aborts at once.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        request_stop()

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
