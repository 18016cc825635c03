"""Reading and writing the ctypes arguments pynvml passes, the way the C library sees them."""

from __future__ import annotations

import ctypes
from typing import Any


def target(arg: object) -> Any:
    """The object an out-parameter points at: ``byref(x)`` gives ``x``, a pointer its contents."""
    obj = getattr(arg, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def as_int(arg: object) -> int:
    """The integer value of a by-value argument: a ctypes scalar such as ``c_uint(3)`` or a plain int."""
    value = getattr(arg, "value", arg)
    if not isinstance(value, int):
        raise TypeError(f"expected an integer argument, got {type(arg).__name__}")
    return value


def address_of(handle: object) -> int | None:
    """The address a device handle (a pointer to an opaque struct) holds; ``None`` if it is not one."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


def store_address(out: object, address: int) -> None:
    """Write ``address`` into the pointer that ``out`` (``byref(c_nvmlDevice_t())``) refers to."""
    ctypes.c_void_p.from_buffer(target(out)).value = address


def store_string(buffer: object, size: object, text: str) -> bool:
    """Copy ``text`` and its terminating NUL into a ``create_string_buffer``; False if it does not fit."""
    data = text.encode()
    if len(data) + 1 > as_int(size):
        return False
    ctypes.memmove(buffer, data + b"\0", len(data) + 1)  # type: ignore[arg-type]
    return True


def store_pointer_field(struct: Any, name: str, address: int) -> None:
    """Write ``address`` into the pointer field ``name`` of a ctypes structure."""
    offset = getattr(type(struct), name).offset
    ctypes.c_void_p.from_address(ctypes.addressof(struct) + offset).value = address
