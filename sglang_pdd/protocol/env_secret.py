"""A secret given as an environment variable or as a file the environment names (a mounted Secret)."""

from __future__ import annotations


def env_or_file(env: dict, name: str, file_name: str) -> tuple[bytes | None, str]:
    """(the value of `name`, or the contents of the file `file_name` names with one trailing newline
    dropped; which variable it came from). (None, name) when neither is set. ValueError when both are
    set or the file cannot be read."""
    value, path = env.get(name, ""), env.get(file_name, "")
    if value and path:
        raise ValueError(f"both {name} and {file_name} are set: set one")
    if not path:
        return (value.encode() if value else None), name
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{file_name}: cannot read {path}: {e.strerror}") from None
    return (data[:-1] if data.endswith(b"\n") else data), file_name
