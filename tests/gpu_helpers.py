"""Test helpers for the GPU layer: a fake ``pynvml`` module and a tiny HTTP server.

The fake NVML raises pynvml's *real* exception classes (``pynvml.NVMLError_NotSupported`` etc.)
and carries pynvml's real constants, so the source under test handles exactly what the real
bindings would raise. Per-device behaviour is data: a value, or an exception instance to raise.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Callable

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci: str = "00000000:00:00.0"
    total_mib: int = 81920
    used_mib: int = 0
    reserved_mib: int = 0
    util_gpu: int = 10
    util_mem: int = 5
    temp: int = 40
    power_mw: Any = 100000
    power_limit_mw: Any = 700000
    fan: Any = None                   # None -> raise NotSupported (datacenter GPUs have no fan)
    pstate: int = 0
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    ecc: tuple[int, int] = (0, 0)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    persistence: int = 1
    recovery_action: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)   # (pid, used bytes)
    xids: list[int] = field(default_factory=list)                    # pending Xid events
    lost: bool = False
    memory_v2: bool = True
    overrides: dict[str, Any] = field(default_factory=dict)          # fn name -> exception to raise
    retired_pending: int = 0                                         # NVML_FEATURE_ENABLED = 1
    ecc_aggregate: tuple[int, int] | None = None                     # None: same as the volatile counts
    mig: list[Any] = field(default_factory=list)                     # FakeMig devices (MIG mode on)
    mig_slots: int = 7


@dataclass
class FakeMig(FakeGpu):
    """A MIG device handle: its own UUID and memory, GPU / compute instance ids."""

    gi: int = 0
    ci: int = 0


class FakeNvml:
    """A stand-in for the ``pynvml`` module. ``broken=True`` makes every call (nvmlInit
    included) raise ``NVMLError_Unknown`` (F08); a ``FakeGpu.lost`` makes that GPU's calls
    raise ``NVMLError_GpuIsLost`` (F09). ``hang`` (an Event) blocks GetPowerUsage until set."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu]) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlMemory_v2", "nvmlEventType", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.broken = False
        self.hang: threading.Event | None = None
        self.calls: list[str] = []
        self.init_calls = 0
        self.init_times: list[float] = []
        self.clock: Callable[[], float] = lambda: 0.0

    # -- library
    def _check(self, name: str) -> None:
        self.calls.append(name)
        if self.broken:
            raise pynvml.NVMLError_Unknown()

    def nvmlInit(self) -> None:
        self.init_calls += 1
        self.init_times.append(self.clock())
        self._check("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.gpus[i]

    def _dev(self, h: FakeGpu, fn: str) -> FakeGpu:
        self._check(fn)
        if h.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in h.overrides:
            raise h.overrides[fn]
        return h

    # -- identity
    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._dev(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._dev(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(busId=self._dev(h, "nvmlDeviceGetPciInfo").pci.encode())

    # -- telemetry
    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: Any = None) -> Any:
        g = self._dev(h, "nvmlDeviceGetMemoryInfo")
        total, used, res = g.total_mib * MIB, g.used_mib * MIB, g.reserved_mib * MIB
        if version is not None:
            if not g.memory_v2:
                raise pynvml.NVMLError_FunctionNotFound()
            return SimpleNamespace(version=version, total=total, reserved=res, used=used,
                                   free=total - used - res)
        return SimpleNamespace(total=total, used=used + res, free=total - used - res)   # v1

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        g = self._dev(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return self._dev(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        g = self._dev(h, "nvmlDeviceGetPowerUsage")
        if self.hang is not None:
            self.hang.wait(10)
        if isinstance(g.power_mw, BaseException):
            raise g.power_mw
        return g.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        g = self._dev(h, "nvmlDeviceGetEnforcedPowerLimit")
        if isinstance(g.power_limit_mw, BaseException):
            raise g.power_limit_mw
        return g.power_limit_mw

    def nvmlDeviceGetFanSpeed(self, h: FakeGpu) -> int:
        g = self._dev(h, "nvmlDeviceGetFanSpeed")
        if g.fan is None:
            raise pynvml.NVMLError_NotSupported()
        return g.fan

    def nvmlDeviceGetPerformanceState(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        g = self._dev(h, "nvmlDeviceGetClockInfo")
        return g.sm_mhz if kind == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, err: int, counter: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTotalEccErrors")
        ecc = g.ecc_aggregate if counter == pynvml.NVML_AGGREGATE_ECC and g.ecc_aggregate else g.ecc
        return ecc[0] if err == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else ecc[1]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetMaxMigDeviceCount").mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, i: int) -> Any:
        g = self._dev(h, "nvmlDeviceGetMigDeviceHandleByIndex")
        if i >= len(g.mig):
            raise pynvml.NVMLError_NotFound()
        return g.mig[i]

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return self._dev(h, "nvmlDeviceGetGpuInstanceId").gi

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        return self._dev(h, "nvmlDeviceGetComputeInstanceId").ci

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return self._dev(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetPersistenceMode(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetPersistenceMode").persistence

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        g = self._dev(h, "nvmlDeviceGetMigMode")
        return [1, 1] if g.mig else [0, 0]

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[int]) -> list[Any]:
        g = self._dev(h, "nvmlDeviceGetFieldValues")
        return [SimpleNamespace(fieldId=ids[0], nvmlReturn=0, valueType=1,
                                value=SimpleNamespace(uiVal=g.recovery_action))]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        g = self._dev(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF)
                for pid, mem in g.processes]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        return f"proc-{pid}"

    # -- events
    def nvmlEventSetCreate(self) -> dict:
        self._check("nvmlEventSetCreate")
        return {"devices": []}

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, es: dict) -> None:
        self._dev(h, "nvmlDeviceRegisterEvents")
        es["devices"].append(h)

    def nvmlEventSetWait_v2(self, es: dict, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        for g in es["devices"]:
            if g.lost:
                raise pynvml.NVMLError_GpuIsLost()
            if g.xids:
                return SimpleNamespace(device=g, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                       eventData=g.xids.pop(0), gpuInstanceId=0, computeInstanceId=0)
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, es: dict) -> None:
        self._check("nvmlEventSetFree")


class TextServer:
    """A real HTTP server on 127.0.0.1 (random port) serving ``routes``: path -> (status,
    content type, body) or a callable(handler) -> (status, content type, body). Records POSTs."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes = routes
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:   # keep test output quiet
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append({"method": method, "path": self.path, "body": body,
                                       "headers": dict(self.headers)})
                route = outer.routes.get(self.path)
                if route is None:
                    status, ctype, payload = 404, "text/plain", "not found"
                elif callable(route):
                    status, ctype, payload = route(self, body)
                else:
                    status, ctype, payload = route
                data = payload.encode() if isinstance(payload, str) else payload
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "TextServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
