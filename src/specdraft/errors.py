"""One exception type for bad input: the CLI prints its message on one line and exits 2."""


class SpecdraftError(Exception):
    """A user-facing problem: the message names the file, the field and the fix."""


def fail(msg: str) -> "NoReturn":  # noqa: F821
    raise SpecdraftError(msg)


def renamed(new_value, old_value, old: str, new: str):
    """The value of an option given under its new name or its deprecated old one (kept for one
    release): the old name prints a one-line note on stderr; both at once is bad input."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise SpecdraftError(f"{old} and {new}: the same option ({old} is its old name); pass {new} only")
    import sys

    print(f"note: {old} is deprecated, use {new} (the old name goes in the next release)", file=sys.stderr)
    return old_value
