"""NvmlGpuBackend beyond the shared contract, against the fake pynvml; plus the fake's own
fidelity to the installed pynvml and open_backend's choice of backend."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

import noded.gpu.nvml as nvml_module
from noded.gpu import (
    EmulatedGpuBackend,
    EmulatedGpuConfig,
    GpuBackendError,
    NvmlGpuBackend,
    open_backend,
)
from noded.gpu.base import GPU_IS_LOST
from noded.gpu.nvml import bus_key
from tests.unit.fake_pynvml import MIB, FakeDevice, FakeNvml


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.standard(4, gpus_per_switch=2, numa_nodes=2)


@pytest.fixture
def backend(fake: FakeNvml) -> Iterator[NvmlGpuBackend]:
    b = NvmlGpuBackend(nvml=fake)
    try:
        yield b
    finally:
        b.close()


def _sys_tree(root: Path, nodes: dict[int, str]) -> Path:
    for node, cpulist in nodes.items():
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    return root


# -- the fake is faithful to pynvml ---------------------------------------------------------------


def test_fake_functions_exist_in_pynvml_with_the_same_parameters() -> None:
    names = [n for n in dir(FakeNvml)
             if n.startswith("nvml") and inspect.isfunction(getattr(FakeNvml, n))]
    assert len(names) > 20
    for name in names:
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]
        assert fake_params == list(inspect.signature(real).parameters), name


def test_every_name_the_backend_uses_exists_in_pynvml_and_the_fake() -> None:
    source = Path(nvml_module.__file__).read_text()
    used = set(re.findall(r"\bnv\.(\w+)", source))
    used |= set(re.findall(r'getattr\(nv, "(\w+)"', source))
    used |= set(re.findall(r'"((?:nvml|NVML_)\w+)"', source))
    assert "nvmlEventSetWait" in used and "NVML_ERROR_GPU_IS_LOST" in used
    fake = FakeNvml.standard(1)
    for name in sorted(used):
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        assert hasattr(fake, name), f"the fake has no {name}"
    assert fake.NVMLError is pynvml.NVMLError
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), pynvml.NVMLError_GpuIsLost)


# -- discovery ----------------------------------------------------------------------------------


def test_numa_from_cpu_affinity_when_numa_node_id_is_missing(fake: FakeNvml,
                                                             tmp_path: Path) -> None:
    fake.hide("nvmlDeviceGetNumaNodeId")
    sys_root = _sys_tree(tmp_path, {0: "0-1", 1: "2-3"})
    b = NvmlGpuBackend(nvml=fake, sys_root=sys_root)
    try:
        assert [g.numa_node for g in b.inventory()[0]] == [0, 0, 1, 1]
    finally:
        b.close()


def test_numa_unknown_when_affinity_spans_nodes(tmp_path: Path) -> None:
    fake = FakeNvml.standard(2)
    for dev in fake.devices:
        dev.numa_node = None  # NOT_SUPPORTED
    fake.devices[0].cpus = (0, 1, 2, 3)
    fake.devices[1].cpus = (2, 3)
    b = NvmlGpuBackend(nvml=fake, sys_root=_sys_tree(tmp_path, {0: "0-1", 1: "2-3"}))
    try:
        assert [g.numa_node for g in b.inventory()[0]] == [-1, 1]
    finally:
        b.close()


def test_strings_as_bytes_from_old_pynvml() -> None:
    b = NvmlGpuBackend(nvml=FakeNvml.standard(1, bytes_strings=True))
    try:
        gpu = b.inventory()[0][0]
        assert isinstance(gpu.uuid, str) and gpu.uuid.startswith("GPU-fake-")
        assert gpu.model == "NVIDIA A100-SXM4-40GB" and gpu.pci_bus_id == "00000000:10:00.0"
    finally:
        b.close()


def test_topology_query_failure_assumes_the_farthest_path(fake: FakeNvml) -> None:
    fake.fail(1, "nvmlDeviceGetTopologyCommonAncestor", pynvml.NVML_ERROR_UNKNOWN)
    b = NvmlGpuBackend(nvml=fake)
    try:
        gpus, topo = b.inventory()
        assert topo[0][1] == topo[1][0] == 50 and topo[2][3] == 10
        assert [g.pcie_switch for g in gpus] == [0, 1, 2, 2]
    finally:
        b.close()


def test_nvlink_direct_and_through_nvswitch() -> None:
    fake = FakeNvml.standard(4)
    gpu, switch = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    bus = [d.bus_id for d in fake.devices]
    # 0 <-> 1 by two direct links; 2 and 3 each reach an NVSwitch by 3 and 2 links.
    fake.devices[0].nvlink_count = fake.devices[1].nvlink_count = 4
    fake.devices[0].nvlinks = {0: (gpu, bus[1]), 1: (gpu, bus[1].lower())}
    fake.devices[1].nvlinks = {0: (gpu, bus[0]), 2: (gpu, bus[0])}
    fake.devices[2].nvlink_count = fake.devices[3].nvlink_count = 6
    fake.devices[2].nvlinks = {i: (switch, "00000000:F0:00.0") for i in range(3)}
    fake.devices[3].nvlinks = {i: (switch, "00000000:F1:00.0") for i in range(2)}
    b = NvmlGpuBackend(nvml=fake)
    try:
        m = b.nvlink_matrix()
        assert m[0][1] == m[1][0] == 2
        assert m[2][3] == m[3][2] == 2
        assert m[0][2] == m[1][3] == 0 and m[0][0] == 0
        # The PCIe matrix is untouched by NVLink.
        assert b.inventory()[1] == tuple(tuple(row) for row in fake.topology)
    finally:
        b.close()


def test_nvlink_without_remote_device_type_counts_foreign_remotes_as_switch() -> None:
    fake = FakeNvml.standard(2)
    fake.hide("nvmlDeviceGetNvLinkRemoteDeviceType")
    for dev in fake.devices:
        dev.nvlink_count = 2
        dev.nvlinks = {0: (0, "00000000:F0:00.0")}
    b = NvmlGpuBackend(nvml=fake)
    try:
        assert b.nvlink_matrix() == ((0, 1), (1, 0))
    finally:
        b.close()


def test_pcie_only_gpus_have_no_nvlink(backend: NvmlGpuBackend) -> None:
    # The fixture's four GPUs: a 4×4 matrix of zeros, not an empty one.
    assert backend.nvlink_matrix() == ((0, 0, 0, 0),) * 4


def test_bus_key_normalises_spellings() -> None:
    assert bus_key("00000000:3B:00.0") == bus_key("0000:3b:00.0") == bus_key(b"0:3b:0.0")
    assert bus_key("garbage") is None


def test_gpu_lost_at_start_is_in_the_inventory_as_unhealthy(fake: FakeNvml) -> None:
    fake.lose_gpu(2)
    b = NvmlGpuBackend(nvml=fake)
    try:
        gpus, topo = b.inventory()
        assert len(gpus) == 4
        assert (gpus[2].healthy, gpus[2].uuid, gpus[2].numa_node) == (False, "unknown-gpu-2", -1)
        assert topo[2][3] == 50  # no path known
        s = b.sample()
        assert (s[2].healthy, s[2].error) == (False, GPU_IS_LOST)
        assert s[3].healthy
        assert b.poll_health() == []  # the inventory carried it; nothing changed since
    finally:
        b.close()


def test_init_failure_is_a_clear_error() -> None:
    fake = FakeNvml.standard(1, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(GpuBackendError, match="NVML initialisation failed: Driver Not Loaded"):
        NvmlGpuBackend(nvml=fake)


def test_count_failure_shuts_nvml_down_again(fake: FakeNvml) -> None:
    fake.fail(None, "nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(GpuBackendError, match="could not count"):
        NvmlGpuBackend(nvml=fake)
    assert not fake.initialised


def test_real_pynvml_without_a_driver_fails_clearly() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVML")
    with pytest.raises(GpuBackendError, match=r"NVML initialisation failed.*NVIDIA driver"):
        NvmlGpuBackend()


# -- sampling -----------------------------------------------------------------------------------


def test_process_query_falls_back_to_older_api_versions(fake: FakeNvml,
                                                        backend: NvmlGpuBackend) -> None:
    fake.set_busy([0], [4242], memory_mib=512)
    for dev in fake.devices:
        dev.failures["nvmlDeviceGetComputeRunningProcesses_v3"] = (
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        )
    assert backend.sample()[0].processes == ((4242, 512),)
    fake.hide("nvmlDeviceGetComputeRunningProcesses_v2")
    fake.hide("nvmlDeviceGetComputeRunningProcesses_v3")
    b = NvmlGpuBackend(nvml=fake)
    try:
        s = b.sample()[0]
        assert (s.processes, s.healthy, s.error) == (((4242, 512),), True, None)
    finally:
        b.close()


def test_no_process_api_at_all_is_not_supported_not_unhealthy(fake: FakeNvml,
                                                              backend: NvmlGpuBackend) -> None:
    for dev in fake.devices:
        for fn in ("nvmlDeviceGetComputeRunningProcesses_v3",
                   "nvmlDeviceGetComputeRunningProcesses_v2",
                   "nvmlDeviceGetComputeRunningProcesses"):
            dev.failures[fn] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    s = backend.sample()[1]
    assert (s.processes, s.healthy, s.error) == ((), True, "processes: not supported")


def test_unknown_process_memory_is_zero(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.devices[0].processes = [(77, None)]
    assert backend.sample()[0].processes == ((77, 0),)


def test_not_supported_is_reported_without_taking_the_gpu_out(fake: FakeNvml,
                                                              backend: NvmlGpuBackend) -> None:
    fake.fail(1, "nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.devices[1].memory_used = 100 * MIB
    s = backend.sample()[1]
    assert (s.utilization_pct, s.memory_used_mib, s.healthy) == (0.0, 100, True)
    assert s.error == "utilization: not supported"


def test_transient_error_marks_one_sample_not_the_gpu(fake: FakeNvml,
                                                      backend: NvmlGpuBackend) -> None:
    fake.fail(2, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN)
    s = backend.sample()[2]
    assert (s.healthy, s.error, s.memory_total_mib) == (False, "memory: Unknown Error", 40960)
    fake.heal(2, "nvmlDeviceGetMemoryInfo")
    s = backend.sample()[2]
    assert (s.healthy, s.error) == (True, None)
    assert backend.poll_health() == []


def test_reset_required_takes_the_gpu_out(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.fail(0, "nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_RESET_REQUIRED)
    assert not backend.sample()[0].healthy
    fake.heal(0, "nvmlDeviceGetUtilizationRates")
    s = backend.sample()[0]
    assert (s.healthy, s.error) == (False, "utilization: GPU requires reset")  # sticky
    events = backend.poll_health()
    assert [(e.index, e.healthy, e.reason) for e in events] == [
        (0, False, "utilization: GPU requires reset")
    ]


def test_closed_backend_refuses_to_sample(fake: FakeNvml) -> None:
    b = NvmlGpuBackend(nvml=fake)
    b.close()
    assert not fake.initialised
    assert all(es.freed for es in fake.event_sets)
    with pytest.raises(GpuBackendError, match="closed"):
        b.sample()


# -- health -------------------------------------------------------------------------------------


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_every_application_xid_is_ignored(fake: FakeNvml, backend: NvmlGpuBackend,
                                          xid: int) -> None:
    fake.inject_xid(0, xid)
    assert backend.poll_health(timeout_ms=10) == []
    assert backend.sample()[0].healthy


def test_xid_on_a_lost_gpu_is_attributed_by_handle(fake: FakeNvml,
                                                   backend: NvmlGpuBackend) -> None:
    fake.lose_gpu(1)  # its UUID can no longer be read
    fake.inject_xid(1, 79)
    events = backend.poll_health(timeout_ms=1000)
    assert [(e.index, e.healthy) for e in events] == [(1, False)]


def test_unattributable_xid_takes_every_gpu_out(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.inject_xid(0, 13, device=object())
    assert backend.poll_health(timeout_ms=10) == []  # still an application error
    fake.inject_xid(0, 95, device=object())
    events = backend.poll_health(timeout_ms=1000)
    assert sorted(e.index for e in events) == [0, 1, 2, 3]
    assert all("unidentified GPU" in e.reason for e in events)


def test_events_unsupported_on_one_gpu(fake: FakeNvml) -> None:
    fake.devices[3].supported_events = 0
    b = NvmlGpuBackend(nvml=fake)
    try:
        assert b.health_events_supported() == (True, True, True, False)
        fake.inject_xid(3, 79)  # NVML would not deliver it: not registered
        assert b.poll_health(timeout_ms=10) == []
        fake.lose_gpu(3)  # but a lost GPU still shows, through sampling
        assert b.sample()[3].error == GPU_IS_LOST
        assert [e.index for e in b.poll_health()] == [3]
    finally:
        b.close()


def test_no_event_set_still_honours_the_timeout_and_reports_sampled_faults(
    fake: FakeNvml,
) -> None:
    fake.fail(None, "nvmlEventSetCreate", pynvml.NVML_ERROR_NOT_SUPPORTED)
    b = NvmlGpuBackend(nvml=fake)
    try:
        assert b.health_events_supported() == (False,) * 4
        assert b.poll_health(timeout_ms=10) == []
        fake.lose_gpu(0)
        b.sample()
        assert [e.index for e in b.poll_health(timeout_ms=1000)] == [0]
    finally:
        b.close()


def test_failing_event_wait_does_not_raise(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.fail(None, "nvmlEventSetWait", pynvml.NVML_ERROR_UNKNOWN)
    assert backend.poll_health(timeout_ms=10) == []


def test_event_storm_is_drained_in_one_poll(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    for i in range(4):
        fake.inject_xid(i, 13)
        fake.inject_xid(i, 63)
    events = backend.poll_health(timeout_ms=1000)
    assert sorted(e.index for e in events) == [0, 1, 2, 3]


def test_reinit_recovers_gpus_that_answer_again(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.inject_xid(1, 48)
    fake.lose_gpu(2)
    backend.sample()
    assert {e.index for e in backend.poll_health(timeout_ms=1000)} == {1, 2}

    assert backend.reinit() == [1]  # GPU 2 is still off the bus
    events = backend.poll_health()
    assert [(e.index, e.healthy, e.reason) for e in events] == [
        (1, True, "recovered by NVML re-initialisation")
    ]
    assert [g.healthy for g in backend.inventory()[0]] == [True, True, False, True]
    assert backend.sample()[2].error == GPU_IS_LOST

    fake.restore_gpu(2)
    assert backend.reinit() == [2]
    assert [(e.index, e.healthy) for e in backend.poll_health()] == [(2, True)]
    assert all(s.healthy for s in backend.sample())
    # The new session's events still reach us.
    fake.inject_xid(0, 79)
    assert [e.index for e in backend.poll_health(timeout_ms=1000)] == [0]


def test_reinit_finding_a_different_gpu_keeps_it_out(fake: FakeNvml,
                                                     backend: NvmlGpuBackend) -> None:
    fake.devices[3].uuid = "GPU-replacement"
    assert backend.reinit() == []
    assert [(e.index, e.healthy) for e in backend.poll_health()] == [(3, False)]
    assert backend.inventory()[0][3].uuid == "GPU-replacement"


def test_reinit_when_nvml_does_not_come_back(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(GpuBackendError, match="Driver Not Loaded"):
        backend.reinit()
    samples = backend.sample()  # no exception, no use of the dead session's handles
    assert all(not s.healthy and s.error == "NVML unavailable" for s in samples)
    fake.init_error = None
    backend.reinit()
    assert all(s.healthy for s in backend.sample())


def test_close_waits_for_a_poll_in_progress(fake: FakeNvml, backend: NvmlGpuBackend) -> None:
    result: list = []
    poller = threading.Thread(target=lambda: result.append(backend.poll_health(timeout_ms=300)))
    poller.start()
    assert fake.waiting.wait(timeout=10)  # the poller is inside nvmlEventSetWait
    backend.close()
    poller.join(timeout=10)
    assert result == [[]]
    assert all(es.freed for es in fake.event_sets)
    assert not fake.freed_while_waiting


def test_nvml_ignores_job_bookkeeping(backend: NvmlGpuBackend) -> None:
    assert backend.job_env("job-1") == {}
    backend.job_started("job-1", (0, 1), (1,))
    backend.job_pids("job-1", (2,))
    backend.job_ended("job-1")


# -- open_backend -------------------------------------------------------------------------------


def test_open_backend_kinds(fake: FakeNvml) -> None:
    b = open_backend("nvml", nvml=fake)
    try:
        assert isinstance(b, NvmlGpuBackend) and len(b.inventory()[0]) == 4
    finally:
        b.close()
    b = open_backend("auto", EmulatedGpuConfig(count=1), nvml=FakeNvml.standard(2))
    try:
        assert b.name == "nvml"  # a working NVML wins over a configured emulation
    finally:
        b.close()
    b = open_backend("emulated")
    try:
        assert isinstance(b, EmulatedGpuBackend) and len(b.inventory()[0]) == 4
    finally:
        b.close()
    with pytest.raises(ValueError, match="unknown GPU backend 'cuda'"):
        open_backend("cuda")


def test_open_backend_auto_without_nvml() -> None:
    broken = FakeNvml.standard(1, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    b = open_backend("auto", EmulatedGpuConfig(count=2, uuid_seed="n9"), nvml=broken)
    try:
        assert b.name == "emulated" and len(b.inventory()[0]) == 2
    finally:
        b.close()
    with pytest.raises(GpuBackendError, match="no usable NVML and no emulated GPU"):
        open_backend("auto", nvml=broken)
    with pytest.raises(GpuBackendError, match="NVML Shared Library Not Found"):
        open_backend("nvml", nvml=broken)


def test_fake_device_defaults_are_sane() -> None:
    dev = FakeDevice(uuid="GPU-x")
    assert dev.supported_events & pynvml.nvmlEventTypeXidCriticalError
