"""A free loopback port and a plain HTTP GET."""
import json
import socket
import urllib.request


def free_port(host="127.0.0.1"):
    """A port nothing listens on now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def get_json(url, timeout=10):
    return json.loads(get(url, timeout))
