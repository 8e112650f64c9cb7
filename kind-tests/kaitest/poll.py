"""Waiting on a condition, the one way every kind-tests script does it.

A test waits on an event, never on time alone: `poll` asks `fn` until it
answers something truthy; the deadline only turns a hang into a failure.
"""
import time


def poll(what, fn, timeout, errors=(), show=None):
    """fn()'s first truthy answer. Exceptions of the types in `errors` count
    as "not yet". On the deadline an AssertionError names `what` and what
    there was instead: `show()` when given, else fn's last answer."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except errors as e:
            last = e
        time.sleep(0.2)
    if show is not None:
        try:
            last = show()
        except errors as e:
            last = e
    raise AssertionError(f"{what}: not within {timeout} s (last: {str(last)[:600]})")
