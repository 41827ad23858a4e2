"""Network transports by name, so callers pick a medium with a string (`--transport shm`).

Every networked backend offers the same two calls:

    async with open_listener(name, spec, secret, **where) as listener:   # the receiving side
        receiver = await listener.accept()                               # after the handshake
    sender = await connect(name, listener.address, spec, secret)         # the sending side

Backends are imported on first use: `verbs` needs pyverbs, which only exists where RDMA does.
"""

from __future__ import annotations

import importlib

__all__ = ["NETWORK_TRANSPORTS", "open_listener", "connect"]

# name -> (module, listener factory, connect function)
NETWORK_TRANSPORTS = {
    "shm": ("slashrt.transport.shm", "open_shm_listener", "connect_shm"),
    "tcp": ("slashrt.transport.tcp", "open_tcp_listener", "connect_tcp"),
    "verbs": ("slashrt.transport.verbs", "open_verbs_listener", "connect_verbs"),
}


def _backend(name: str):
    try:
        module, listen, dial = NETWORK_TRANSPORTS[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; choose one of {sorted(NETWORK_TRANSPORTS)}") from None
    mod = importlib.import_module(module)
    return getattr(mod, listen), getattr(mod, dial)


def open_listener(name: str, spec, secret: bytes, **where):
    """An async context manager yielding a listener with `.address` and `await .accept()`."""
    return _backend(name)[0](spec, secret, **where)


async def connect(name: str, address, spec, secret: bytes):
    """Connect a sender to a listener's address (after the handshake)."""
    return await _backend(name)[1](address, spec, secret)
