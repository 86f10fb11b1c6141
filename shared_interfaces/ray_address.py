"""A Ray cluster address checked before ``ray.init`` joins it: ``ray.init`` waits about a minute for a GCS that
is not there (and retries meanwhile with warnings), so a mistyped ``--ray-address`` looked like a hang. Both
backends (``bandit_sim sweep --runtime ray``, ``mrl_llm train --runtime ray``) call :func:`check_ray_address`.
"""

from __future__ import annotations

import re
import socket

from shared_interfaces.config_io import ConfigError

#: ``host:port`` or ``ray://host:port`` (Ray client); ``auto``, ``local`` and None are Ray's own words.
_HOST_PORT = re.compile(r"^(?:ray://)?(?P<host>\[[0-9a-fA-F:]+\]|[^:/\s]+):(?P<port>\d{1,5})$")


def check_ray_address(address: str | None, *, flag: str, timeout_s: float = 5.0) -> None:
    """A :class:`ConfigError` naming ``flag`` when ``address`` (``host:port`` or ``ray://host:port``) has no
    listener within ``timeout_s``, or is not an address at all; nothing for None, ``auto`` or ``local``."""
    if address is None or address in ("auto", "local"):
        return
    m = _HOST_PORT.match(address.strip())
    if m is None:
        raise ConfigError(f"{flag} {address!r} is not a Ray address; give HOST:PORT of the head node (its GCS port, "
                          "6379 by default), ray://HOST:PORT, or auto")
    host, port = m["host"].strip("[]"), int(m["port"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as err:
        raise ConfigError(f"{flag} {address}: no Ray cluster answers there ({err.strerror or err}); start one with "
                          "`ray start --head` on that node, or leave it out for a local cluster") from None
