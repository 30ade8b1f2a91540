"""File boundaries: reading user files safely and writing output files atomically.

Every file a user hands to simgrid (profile, model, program, trace, sweep CSV) is read through
:mod:`simgrid.io.inputs`, which refuses what is not a regular UTF-8 file of bounded size and turns parser
failures (malformed text, nesting too deep, integers too long) into one-line errors naming the file.
Every file the CLI writes goes through :mod:`simgrid.io.atomic`: a temporary file in the target directory,
then a rename, so a failed write leaves nothing behind.
"""

from simgrid.io.atomic import atomic_output, atomic_write_text, check_output_path, check_output_paths
from simgrid.io.inputs import parse_json, parse_toml, read_input_bytes, read_input_text, short_path

__all__ = [
    "atomic_output",
    "atomic_write_text",
    "check_output_path",
    "check_output_paths",
    "parse_json",
    "parse_toml",
    "read_input_bytes",
    "read_input_text",
    "short_path",
]
