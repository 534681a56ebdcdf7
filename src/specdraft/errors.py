"""One exception type for bad input: the CLI prints its message on one line and exits 2."""


class SpecdraftError(Exception):
    """A user-facing problem: the message names the file, the field and the fix."""

