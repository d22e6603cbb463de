"""What a rank's process uses, for its heartbeat: CPU %, RSS, and on a GPU its memory and utilisation.

Read about once a second (a few ``/proc`` reads). GPU memory comes from PyTorch's own counters
(allocated and reserved by its caching allocator) once the rank has initialised CUDA: the
heartbeat never initialises it. The device's utilisation and its memory in use by every
process come from NVML, through ``nvidia-ml-py`` (the ``pynvml`` module; the maintained
package, from NVIDIA), when it is installed; without it those two are left out.
"""

from __future__ import annotations

from typing import Any

import psutil


class Resources:
    """One rank's readings; :meth:`sample` gives the heartbeat's fields."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first reading starts the count
        self._nvml: Any = None
        self._nvml_tried = False

    def sample(self, device: Any) -> dict[str, float]:
        """``rss_mb`` and ``cpu_percent`` (of one core, since the last sample), and on an initialised CUDA
        device ``gpu_mem_mb``, ``gpu_reserved_mb`` and, with NVML, ``gpu_util`` and ``gpu_used_mb``."""
        found = {"rss_mb": self._process.memory_info().rss / 2**20, "cpu_percent": self._process.cpu_percent(None)}
        if getattr(device, "type", "cpu") == "cuda":
            found.update(self._gpu(device))
        return found

    def _gpu(self, device: Any) -> dict[str, float]:
        import torch

        if not torch.cuda.is_initialized():
            return {}
        found = {"gpu_mem_mb": torch.cuda.memory_allocated(device) / 2**20,
                 "gpu_reserved_mb": torch.cuda.memory_reserved(device) / 2**20}
        handle = self._nvml_handle(device)
        if handle is not None:
            import pynvml

            try:
                found["gpu_util"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                found["gpu_used_mb"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except Exception:  # noqa: BLE001 - NVML refused (a MIG slice, a driver issue): without them
                pass
        return found

    def _nvml_handle(self, device: Any) -> Any:
        if self._nvml_tried:
            return self._nvml
        self._nvml_tried = True
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            # NVML numbers devices as the machine does; torch as CUDA_VISIBLE_DEVICES shows them
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self._nvml = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - no nvidia-ml-py, or no NVML: torch's own counters only
            self._nvml = None
        return self._nvml
