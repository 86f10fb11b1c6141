"""``check_ray_address``: a Ray address with no listener is named at once (``ray.init`` waited about a minute
with warnings), one that is not an address says what to give, Ray's own words pass."""

from __future__ import annotations

import socket
import time

import pytest

from shared_interfaces.config_io import ConfigError
from shared_interfaces.ray_address import check_ray_address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_named_at_once():
    port = _free_port()
    t0 = time.perf_counter()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConfigError, match=rf"--ray-address {address}: no Ray cluster answers there .*ray start "
                                              r"--head"):
            check_ray_address(address, flag="--ray-address")
    assert time.perf_counter() - t0 < 5


def test_a_listener_passes_and_rays_own_words_are_not_checked():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}", flag="--ray-address")
    for address in (None, "auto", "local"):
        check_ray_address(address, flag="--ray-address")


@pytest.mark.parametrize("address", ["", "localhost", "http://x:1", "x:port", "a b:1"])
def test_not_an_address(address):
    with pytest.raises(ConfigError, match="is not a Ray address; give HOST:PORT"):
        check_ray_address(address, flag="--ray-address")
