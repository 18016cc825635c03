"""NVML C constants the fake needs, with the values of ``nvml.h`` (deliberately not imported from pynvml)."""

from __future__ import annotations

from typing import Final

NVML_SUCCESS: Final = 0
NVML_ERROR_UNINITIALIZED: Final = 1
NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_ALREADY_INITIALIZED: Final = 5
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_INSUFFICIENT_SIZE: Final = 7
NVML_ERROR_INSUFFICIENT_POWER: Final = 8
NVML_ERROR_DRIVER_NOT_LOADED: Final = 9
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_IRQ_ISSUE: Final = 11
NVML_ERROR_LIBRARY_NOT_FOUND: Final = 12
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_CORRUPTED_INFOROM: Final = 14
NVML_ERROR_GPU_IS_LOST: Final = 15
NVML_ERROR_RESET_REQUIRED: Final = 16
NVML_ERROR_OPERATING_SYSTEM: Final = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH: Final = 18
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_MEMORY: Final = 20
NVML_ERROR_NO_DATA: Final = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25
NVML_ERROR_UNKNOWN: Final = 999

ERROR_STRINGS: Final[dict[int, str]] = {
    NVML_SUCCESS: "Success",
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_NO_DATA: "No data",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

NVML_INIT_FLAG_NO_GPUS: Final = 1
NVML_INIT_FLAG_NO_ATTACH: Final = 2

NVML_TEMPERATURE_GPU: Final = 0

NVML_PCIE_UTIL_TX_BYTES: Final = 0
NVML_PCIE_UTIL_RX_BYTES: Final = 1

NVML_VALUE_TYPE_UNSIGNED_INT: Final = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: Final = 3

NVML_FI_DEV_NVLINK_LINK_COUNT: Final = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: Final = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: Final = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES: Final = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES: Final = 198

NVML_MEMORY_V2_STRUCT_SIZE: Final = 40
"""``sizeof(nvmlMemory_v2_t)``: a 4-byte version padded to 8, then four 8-byte counters."""
NVML_MEMORY_V2_VERSION: Final = NVML_MEMORY_V2_STRUCT_SIZE | (2 << 24)
"""``nvmlMemory_v2``, i.e. ``NVML_STRUCT_VERSION(Memory, 2)`` = 0x02000028."""
