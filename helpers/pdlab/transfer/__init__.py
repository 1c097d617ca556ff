"""KV-cache transfer: napkin arithmetic and real, verified transports between processes.

- napkin (:mod:`pdlab.transfer.napkin`): ``kv_transfer``, ``resolve_bandwidth``, ``disaggregation_gain_s``.
- measured (:mod:`pdlab.transfer.bench`): ``benchmark`` over shm, tcp, gloo, Mooncake, NIXL
  (and CUDA copies on a GPU), with memcpy measured in the same run; sizes from
  :mod:`pdlab.transfer.sizes`.
- layer-wise overlap (:mod:`pdlab.transfer.overlap`), emulated links (:mod:`pdlab.transfer.netem`),
  Mooncake Store as a KV block store (:mod:`pdlab.transfer.store`).

The measured parts import their libraries lazily: importing this package starts nothing.
"""

from pdlab.transfer.bench import BenchReport, benchmark, link_comparison, measure_transport
from pdlab.transfer.kvbuffer import KVLayout, checksum, layout_for_size, make_payload, memcpy_bandwidth
from pdlab.transfer.measurement import Measurement, VerificationError
from pdlab.transfer.napkin import (
    disaggregation_gain_s,
    kv_transfer,
    resolve_bandwidth,
)
from pdlab.transfer.sizes import format_size, parse_size, parse_sizes, size_sweep, sizes_for_profile
from pdlab.transfer.transports import (
    TRANSPORTS,
    TransportUnavailable,
    check_available,
    expand_transports,
    transport_status,
)

__all__ = [
    "kv_transfer", "resolve_bandwidth", "disaggregation_gain_s",
    "benchmark", "measure_transport", "link_comparison", "BenchReport", "Measurement", "VerificationError",
    "KVLayout", "layout_for_size", "make_payload", "checksum", "memcpy_bandwidth",
    "parse_size", "parse_sizes", "format_size", "size_sweep", "sizes_for_profile",
    "TRANSPORTS", "TransportUnavailable", "check_available", "expand_transports", "transport_status",
]
