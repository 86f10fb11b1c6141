"""The plan's device cells (:func:`mrl_llm.distributed.plan_render.devices_text`): a range only where the GPUs run on."""

import pytest

from mrl_llm.distributed.plan_render import devices_text


@pytest.mark.parametrize(("names", "text"), [
    ((), "-"),
    (("node0/gpu3",), "node0/gpu3"),
    (("node0/gpu0", "node0/gpu1", "node0/gpu2"), "node0/gpu0..gpu2 (3)"),
    # across nodes: each node's run (this printed "node0/gpu0..gpu0 (3)")
    (("node0/gpu0", "node0/gpu1", "node1/gpu0"), "node0/gpu0..gpu1, node1/gpu0 (3)"),
    (("node0/gpu1", "node0/gpu3"), "node0/gpu1, node0/gpu3 (2)"),
    (("node0/ram", "node0/ram"), "node0/ram (2)"),  # CPU slots: a node's RAM named once
    (("node0/ram", "node1/ram"), "node0/ram, node1/ram (2)"),
    (tuple(f"node{i}/gpu{j}" for i in range(5) for j in range(8)), "node0/gpu0..gpu7, ..., node4/gpu0..gpu7 (40)"),
])
def test_device_cells_name_each_run_of_devices(names, text):
    assert devices_text(names) == text
