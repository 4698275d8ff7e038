"""`ray.init` sets a SIGTERM handler that ends the process at once; a process with one of its
own (`apply --watch`: an apply under way finishes first) keeps it, while Ray connects too."""

import inspect
import signal
import sys

import ray
import ray._private.utils as ray_utils

from specctl.deploy.ray_connect import _own_signal_handlers


def test_ray_inits_handler_is_not_set_over_the_processs_own() -> None:
    # the contract relied on: ray.init sets its handler through this function
    assert "set_sigterm_handler(" in inspect.getsource(ray.init)

    def ours(*_: object) -> None:
        pass

    def rays(signum: int, _frame: object) -> None:
        sys.exit(signum)

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        with _own_signal_handlers():
            ray_utils.set_sigterm_handler(rays)  # what ray.init does as it starts
            assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGTERM) is ours
        assert ray_utils.set_sigterm_handler is not None
        # a process without a handler of its own (a plain apply) gets Ray's while it connects
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _own_signal_handlers():
            ray_utils.set_sigterm_handler(rays)
            assert signal.getsignal(signal.SIGTERM) is rays
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
