"""Sizes as a user types them (``12G``, ``800M``, a bare number of GiB) and as messages
print them."""

import re

from poskernel_tl.errors import UserError

GiB = 1 << 30


def parse_memory(text: str | int | float) -> int | None:
    """``--max-memory``: None for ``auto``, else bytes from ``12G``, ``800M``, ``1.5GiB``
    or a bare number of GiB."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise UserError(f"--max-memory {text!r}: a size such as 12G or 800M, or auto")
    if text.strip().lower() == "auto":
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if m is None or float(m.group(1)) <= 0:
        raise UserError(f"--max-memory {text}: a positive size such as 12G or 800M, or auto")
    unit = {"k": 1 << 10, "m": 1 << 20, "g": GiB, "t": 1 << 40, "": GiB}[m.group(2)]
    return int(float(m.group(1)) * unit)


def gib(n: int | float) -> str:
    """Bytes for a message: GiB with one decimal, or MiB below 1 GiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"


def check_batch_size(batch_size: int | str) -> int | str:
    """``"auto"``, or the batch size as a positive int (a ValueError naming the flag
    otherwise): the check that needs no model."""
    if batch_size == "auto":
        return batch_size
    if isinstance(batch_size, str):
        try:
            batch_size = int(batch_size)
        except ValueError:
            raise UserError(f"--batch-size {batch_size}: a positive integer or auto"
                             ) from None
    if batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: must be >= 1 (or auto)")
    return int(batch_size)


__all__ = ["GiB", "check_batch_size", "gib", "parse_memory"]
