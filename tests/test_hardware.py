"""GPU and link catalogs and device detection."""

from __future__ import annotations

import pytest
from pdlab.catalog import UnknownNameError
from pdlab.hardware import detect_device, dtype_bytes, get_gpu, get_link, list_gpus, list_links

REQUIRED_GPUS = ["a100-40gb", "a100-80gb", "a800", "h100-sxm", "h100-pcie", "h800", "h200", "b200", "l40s", "l4",
                 "a10g"]
REQUIRED_LINKS = ["nvlink3", "nvlink4", "nvlink5", "pcie-gen4", "pcie-gen5", "ib-hdr", "ib-ndr", "ib-xdr",
                  "roce-100", "roce-200", "roce-400", "eth-25g", "eth-10g"]


def test_catalog_has_every_required_gpu_with_sources_and_numbers():
    keys = [g.key for g in list_gpus()]
    assert set(REQUIRED_GPUS) <= set(keys)
    for g in list_gpus():
        assert g.source and g.confidence in {"V", "S", "U", "C"}
        assert isinstance(g.bf16_flops, float) and g.bf16_flops > 1e13
        assert isinstance(g.hbm_bytes_per_s, float) and g.hbm_bytes_per_s > 1e11
        assert g.memory_gb > 0 and g.tdp_w > 0 and g.pcie_gen in (4, 5)


def test_reference_ridge_points():
    assert get_gpu("h100-sxm").ridge_point() == pytest.approx(295, abs=1)
    assert get_gpu("a100-80gb").ridge_point() == pytest.approx(153, abs=1)
    assert get_gpu("h200").ridge_point() == pytest.approx(206, abs=1)
    assert get_gpu("l40s").ridge_point() == pytest.approx(419, abs=1)


def test_fp8_peak_and_its_absence_on_ampere():
    assert get_gpu("h100-sxm").peak_flops("fp8") == pytest.approx(2 * get_gpu("h100-sxm").peak_flops("bf16"), rel=0.01)
    with pytest.raises(ValueError, match="FP8"):
        get_gpu("a100-80gb").peak_flops("fp8")


def test_links_are_per_direction_decimal():
    assert set(REQUIRED_LINKS) <= {link.key for link in list_links()}
    assert get_link("ib-ndr").bytes_per_s == 50e9 and get_link("ib-ndr").gbit_per_s == 400
    assert get_link("nvlink4").bytes_per_s == 450e9
    assert get_link("eth-25g").bytes_per_s == 3.125e9
    assert all(link.source for link in list_links())


def test_names_are_normalised_and_unknown_names_suggest():
    assert get_gpu("H100_SXM").key == "h100-sxm"
    with pytest.raises(UnknownNameError) as err:
        get_link("ib-ndrr")
    assert "ib-ndr" in str(err.value)


def test_dtype_bytes():
    assert dtype_bytes("bf16") == 2 and dtype_bytes("FP8") == 1
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("fp6")


def test_detect_device_never_assumes_a_gpu():
    info = detect_device()
    assert info["kind"] in ("cpu", "cuda") and info["count"] >= 1 and info["name"]
    import torch

    assert (info["kind"] == "cuda") == torch.cuda.is_available()


def test_resolve_link_bandwidth_one_rule_for_every_caller():
    from pdlab.hardware import get_link, resolve_link_bandwidth
    from pdlab.transfer import resolve_bandwidth

    assert resolve_link_bandwidth() is None
    assert resolve_link_bandwidth("ib-ndr") == get_link("ib-ndr").bytes_per_s
    assert resolve_link_bandwidth(bandwidth_bytes_per_s=25e9) == 25e9
    assert resolve_bandwidth(bandwidth_gbs=25) == 25e9
    with pytest.raises(ValueError, match="not both"):
        resolve_link_bandwidth("ib-ndr", 25e9)
    with pytest.raises(ValueError, match="positive"):
        resolve_bandwidth(bandwidth_gbs=0)


def test_resolve_device(monkeypatch):
    import pdlab.hardware as hw

    monkeypatch.setattr(hw, "cuda_available", lambda: False)
    assert hw.resolve_device("auto") == "cpu"
    assert hw.resolve_device("CPU") == "cpu"
    with pytest.raises(ValueError, match="no CUDA GPU"):
        hw.resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        hw.resolve_device("tpu")
    assert hw.detect_device()["kind"] == "cpu"
    monkeypatch.setattr(hw, "cuda_available", lambda: True)
    assert hw.resolve_device() == "cuda"


def test_catalog_entries_are_typed_and_errors_name_file_entry_and_field():
    from pdlab.catalog import CatalogError, load_yaml, typed_fields
    from pdlab.hardware import GPU, Link

    entry = dict(load_yaml("gpus.yaml")["h100-sxm"])
    fields = typed_fields(GPU, entry, file="gpus.yaml", key="h100-sxm")
    assert fields["memory_gb"] == entry["memory_gb"] and fields["pcie_gen"] == entry["pcie_gen"]
    for field, bad, problem in [("hbm_bytes_per_s", "fast", "number"), ("pcie_gen", 4.5, "whole number"),
                                ("source", "", "non-empty"), ("tdp_w", None, "missing"), ("bf16_flops", -1, ">= 0")]:
        with pytest.raises(CatalogError, match=rf"gpus.yaml: entry 'h100-sxm', field '{field}': .*{problem}") as info:
            typed_fields(GPU, {**entry, field: bad}, file="gpus.yaml", key="h100-sxm")
        assert (info.value.file, info.value.entry, info.value.field) == ("gpus.yaml", "h100-sxm", field)
    assert typed_fields(GPU, {k: v for k, v in entry.items() if k != "fp8_flops"}, file="g", key="k")["fp8_flops"] is None
    with pytest.raises(CatalogError, match="field 'bytes_per_s'"):
        typed_fields(Link, {"name": "x", "kind": "ib", "source": "s", "confidence": "V"}, file="links.yaml", key="x")
    with pytest.raises(CatalogError, match="mapping"):
        typed_fields(Link, ["not", "a", "mapping"], file="links.yaml", key="x")


def test_model_catalog_errors_name_the_field(monkeypatch):
    import pdlab.models as models
    from pdlab.catalog import CatalogError

    good = models.load_yaml("models.yaml")
    broken = {**good, "llama-3-8b": {**good["llama-3-8b"], "config": {**good["llama-3-8b"]["config"],
                                                                        "num_hidden_layers": "32"}}}
    monkeypatch.setattr(models, "load_yaml", lambda name: broken)
    with pytest.raises(CatalogError, match=r"models.yaml: entry 'llama-3-8b', field 'config.num_hidden_layers'"):
        models.get_model("llama-3-8b")
    monkeypatch.setattr(models, "load_yaml", lambda name: {"m": {"config": {"vocab_size": 10}}})
    with pytest.raises(CatalogError, match="entry 'm', field 'config'"):
        models.get_model("m")
