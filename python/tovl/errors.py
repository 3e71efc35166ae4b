"""tovl_status as exceptions: one base class, one subclass per cause group (the hundreds digit)."""

from __future__ import annotations

from . import _lib


class TovlError(Exception):
    """A tovl call failed. `status` is the tovl_status code, `detail` tovl_last_error()'s line."""

    def __init__(self, status: int, detail: str, name: str = "") -> None:
        self.status = status
        self.detail = detail
        self.name = name or _lib.text(_lib.lib.tovl_status_str(status))
        super().__init__(f"{self.name}: {detail}" if detail else self.name)


class InvalidInputError(TovlError, ValueError):
    """1xx: the caller passed something wrong (argument, duplicate or out-of-range id, shape, vocab)."""


class UnavailableError(TovlError):
    """2xx: the environment lacks something (backend, kernel, feature, backend name)."""


class DeviceError(TovlError):
    """3xx: the device or its driver failed (memory, driver call, launch)."""


class FileFormatError(TovlError):
    """4xx: a file could not be read or is malformed."""


class InternalError(TovlError):
    """9xx: a bug in tovl itself."""


_GROUPS: dict[int, type[TovlError]] = {
    1: InvalidInputError,
    2: UnavailableError,
    3: DeviceError,
    4: FileFormatError,
    9: InternalError,
}


def error_for(status: int, detail: str) -> TovlError:
    """The exception for a failed status, of its group's class."""
    return _GROUPS.get(status // 100, InternalError)(status, detail)


def check(status: int) -> None:
    """Raise the group's exception, with tovl_last_error()'s detail, unless status is TOVL_OK."""
    if status != 0:
        raise error_for(status, _lib.text(_lib.lib.tovl_last_error()))


def invalid(what: str) -> InvalidInputError:
    """A Python-side argument check failing: TOVL_ERR_INVALID_ARGUMENT with `what` as the detail."""
    return InvalidInputError(100, what)


def shape(what: str) -> InvalidInputError:
    """A Python-side shape or stride check failing: TOVL_ERR_SHAPE_MISMATCH."""
    return InvalidInputError(103, what)
