"""One pydantic model per file the tool reads back, one module per file kind: the schema a file's writer
fills and every reader checks (io.read_model: one line naming the file, the field and the fix)."""
