"""The pure-torch kvcacheio ops (plugin/compat/kvcacheio_cpu.py) against a token-by-token reference copy, on
random device and host pools of every layout the MHA host pool uses, with negative (skipped) indices."""
from __future__ import annotations

import pytest
import torch

from sglang_cpp.plugin.compat import kvcacheio_cpu as io

LAYERS, DEV, HOST, HEADS, DIM, PAGE = 3, 40, 48, 2, 8, 4


def _device(seed):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(DEV, HEADS, DIM, generator=g) for _ in range(LAYERS)],
            [torch.randn(DEV, HEADS, DIM, generator=g) for _ in range(LAYERS)])


def _host(layout, seed):
    g = torch.Generator().manual_seed(seed)
    shape = {"layer_first": (LAYERS, HOST, HEADS, DIM), "page_first": (HOST, LAYERS, HEADS, DIM),
             "page_first_direct": (HOST // PAGE, LAYERS, PAGE, HEADS, DIM)}[layout]
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def _slot(host, layout, layer, t):
    """The host row of token t in layer `layer` (a view), written out for each layout."""
    if layout == "layer_first":
        return host[layer, t]
    if layout == "page_first":
        return host[t, layer]
    return host[t // PAGE, layer, t % PAGE]


# device rows 5..12 <-> host rows 30..37, plus pairs with a negative side that must be skipped
DEV_IDX = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, -1, 3, 2])
HOST_IDX = torch.tensor([30, 31, 32, 33, 34, 35, 36, 37, 20, -1, -5])


def _backup_reference(dev, host, layout):
    for i, (d, h) in enumerate(zip(DEV_IDX.tolist(), HOST_IDX.tolist())):
        if d < 0 or h < 0:
            continue
        for layer in range(LAYERS):
            for kv in (0, 1):
                _slot(host[kv], layout, layer, h).copy_(dev[kv][layer][d])


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_backup_all_layers_matches_a_token_by_token_copy(layout):
    dev = _device(0)
    host, want = _host(layout, 1), _host(layout, 1)
    _backup_reference(dev, want, layout)
    k, v = dev
    if layout == "layer_first":
        io.transfer_kv_all_layer(k, list(host[0]), v, list(host[1]), DEV_IDX, HOST_IDX, item_size=64, num_layers=3)
    elif layout == "page_first":
        io.transfer_kv_all_layer_lf_pf(k, host[0], v, host[1], DEV_IDX, HOST_IDX, item_size=64,
                                       dst_layout_dim=192, num_layers=3)
    else:
        io.transfer_kv_all_layer_direct_lf_pf(k + v, list(host), DEV_IDX, HOST_IDX, page_size=PAGE)
    assert torch.equal(host[0], want[0]) and torch.equal(host[1], want[1])
    assert not torch.equal(host[0], _host(layout, 1)[0])  # it did write


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "direct_layer_first"])
def test_load_one_layer_matches_a_token_by_token_copy(layout):
    hl = "layer_first" if layout == "direct_layer_first" else layout
    host = _host(hl, 2)
    k, v = _device(3)
    wk, wv = _device(3)
    layer = 1
    for d, h in zip(DEV_IDX.tolist(), HOST_IDX.tolist()):
        if d >= 0 and h >= 0:
            wk[layer][d].copy_(_slot(host[0], hl, layer, h))
            wv[layer][d].copy_(_slot(host[1], hl, layer, h))
    if layout == "layer_first":
        io.transfer_kv_per_layer(host[0][layer], k[layer], host[1][layer], v[layer], HOST_IDX, DEV_IDX, item_size=64)
    elif layout == "page_first":
        io.transfer_kv_per_layer_pf_lf(host[0], k[layer], host[1], v[layer], HOST_IDX, DEV_IDX, layer_id=layer,
                                       item_size=64, src_layout_dim=192)
    elif layout == "page_first_direct":
        io.transfer_kv_per_layer_direct_pf_lf(list(host), [k[layer], v[layer]], HOST_IDX, DEV_IDX, layer_id=layer,
                                              page_size=PAGE)
    else:
        io.transfer_kv_direct([host[0][layer], host[1][layer]], [k[layer], v[layer]], HOST_IDX, DEV_IDX, page_size=PAGE)
    for got, want in ((k, wk), (v, wv)):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not torch.equal(k[layer], _device(3)[0][layer])  # it did write


def test_round_trip_through_the_host_restores_the_evicted_rows():
    """Back up device rows to page_first host rows, wipe the device, load every layer back elsewhere."""
    k, v = _device(4)
    host = _host("page_first", 5)
    src, slots, dst = torch.arange(0, 16), torch.arange(8, 24), torch.arange(20, 36)
    io.transfer_kv_all_layer_lf_pf(k, host[0], v, host[1], src, slots)
    want = [t[:, :16].clone() for t in (torch.stack(k), torch.stack(v))]
    for t in k + v:
        t.zero_()
    for layer in range(LAYERS):
        io.transfer_kv_per_layer_pf_lf(host[0], k[layer], host[1], v[layer], slots, dst, layer_id=layer)
    assert torch.equal(torch.stack(k)[:, 20:36], want[0]) and torch.equal(torch.stack(v)[:, 20:36], want[1])


def test_mismatched_index_lengths_are_named():
    k, v = _device(6)
    with pytest.raises(ValueError, match="3 source and 2 destination indices"):
        io.transfer_kv_per_layer(k[0], k[1], v[0], v[1], torch.tensor([1, 2, 3]), torch.tensor([1, 2]))
