"""Where profiles live and how a name finds its file.

Search order (first match wins): each folder in ``$SIMGRID_PROFILE_PATH`` (``os.pathsep``-separated),
then ``~/.config/simgrid/profiles``, then the built-in folder: ``<repo>/hardware_profiles`` for a clone
or editable install, else ``<prefix>/share/llm-simgrid/hardware_profiles`` where pyproject's
data-files put it for a wheel install. In any folder a profile may sit in ``gpus/``, ``nodes/``,
``clusters/`` or directly in the folder; a profile's name is its file name without ``.toml``.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from simgrid.errors import ProfileError
from simgrid.io.inputs import decode_utf8, parse_toml, read_input_bytes, short_path

ProfileKind = Literal["gpu", "node", "cluster"]
PROFILE_KINDS: tuple[str, ...] = get_args(ProfileKind)
ENV_VAR = "SIMGRID_PROFILE_PATH"
_SHARE_SUBDIR = Path("share", "llm-simgrid", "hardware_profiles")


@dataclass(frozen=True, kw_only=True)
class ProfileInfo:
    """One profile found on the search path."""

    kind: str
    """``gpu``, ``node`` or ``cluster``."""
    name: str
    """Name to load it by (the file name without ``.toml``)."""
    description: str
    """The profile's one-line description."""
    path: Path
    """The file."""


def display_path(path: Path) -> str:
    """A path as error messages show it: relative to the working directory when under it, long ones elided."""
    return short_path(path)


class ProfileWarning(UserWarning):
    """A file on the profile search path was skipped (not a regular file, or malformed)."""


def read_toml(path: Path, *, what: str = "profile file") -> dict[str, Any]:
    """Parse a TOML profile; a file that is not a regular UTF-8 TOML file becomes a ProfileError naming it.

    Only regular files are opened (a FIFO named ``x.toml`` would block forever); non-UTF-8 bytes, nesting
    deeper than Python can parse and integers of thousands of digits are reported, not raised raw.
    """
    data = read_input_bytes(path, what=what, error=ProfileError)
    text = decode_utf8(data, source=display_path(path), error=ProfileError)
    return parse_toml(text, source=display_path(path), error=ProfileError)


def builtin_profile_dir() -> Path:
    """The profiles shipped with the package (clone/editable install first, then the wheel's data dir)."""
    repo_dir = Path(__file__).resolve().parents[2] / "hardware_profiles"
    if repo_dir.is_dir():
        return repo_dir
    for prefix in (sys.prefix, sysconfig.get_path("data")):
        candidate = Path(prefix) / _SHARE_SUBDIR
        if candidate.is_dir():
            return candidate
    return Path(sys.prefix) / _SHARE_SUBDIR


def profile_search_path() -> list[Path]:
    """Folders searched for profiles, highest priority first (missing folders are skipped when searching)."""
    folders = [Path(entry).expanduser() for entry in os.environ.get(ENV_VAR, "").split(os.pathsep) if entry]
    folders.append(Path.home() / ".config" / "simgrid" / "profiles")
    folders.append(builtin_profile_dir())
    unique: list[Path] = []
    for folder in folders:
        if folder not in unique:
            unique.append(folder)
    return unique


def _is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (following links); others are skipped with a warning."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        warnings.warn(f"skipping {display_path(path)} on the profile search path: {exc.strerror or exc}",
                      ProfileWarning, stacklevel=4)
        return False
    if stat.S_ISREG(mode):
        return True
    what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
    warnings.warn(f"skipping {display_path(path)} on the profile search path: it is {what}", ProfileWarning,
                  stacklevel=4)
    return False


def _candidate_files(folder: Path) -> list[tuple[str | None, Path]]:
    """(kind implied by the sub-folder or None, file) for every regular ``.toml`` file in a search folder."""
    found: list[tuple[str | None, Path]] = []
    for kind in PROFILE_KINDS:
        sub = folder / f"{kind}s"
        if sub.is_dir():
            found.extend((kind, path) for path in sorted(sub.glob("*.toml")))
    if folder.is_dir():
        found.extend((None, path) for path in sorted(folder.glob("*.toml")))
    return [(kind, path) for kind, path in found if _is_regular(path)]


@dataclass(frozen=True)
class _Entry:
    """One profile file on the search path, in search order."""

    kind: str | None
    """Its kind (from the sub-folder or its ``kind`` key); None when unreadable at the top of a folder."""
    name: str
    path: Path
    problem: str | None = None
    """Why it cannot be read (the ProfileError's message), or None."""


def _scan() -> list[_Entry]:
    """Every profile file on the search path, first match first; unreadable files keep their error.

    A broken file does not break the lookup of other names (built-in ones included): it is only an
    error when it is the file asked for, and ``simgrid profiles`` lists it as skipped with a warning.
    """
    entries: list[_Entry] = []
    for folder in profile_search_path():
        for implied_kind, path in _candidate_files(folder):
            if implied_kind is not None:
                entries.append(_Entry(implied_kind, path.stem, path))
                continue
            try:
                kind = read_toml(path).get("kind")
            except ProfileError as exc:
                entries.append(_Entry(None, path.stem, path, str(exc)))
                continue
            entries.append(_Entry(kind if isinstance(kind, str) else "?", path.stem, path))
    return entries


def _index(entries: list[_Entry] | None = None) -> dict[tuple[str, str], Path]:
    """(kind, name) -> file of the readable profiles, first match on the search path winning."""
    index: dict[tuple[str, str], Path] = {}
    for entry in _scan() if entries is None else entries:
        if entry.problem is None and entry.kind is not None:
            index.setdefault((entry.kind, entry.name), entry.path)
    return index


def find_profile(name: str, kind: str, *, referrer: str = "") -> Path:
    """The file of profile ``name`` of ``kind``; a clear error for wrong kinds and unknown names.

    ``referrer`` (e.g. ``"nodes/x.toml: gpu = 'foo'"``) prefixes the message when another profile
    refers to the missing one. When the first file of that name on the search path cannot be read, its
    error is raised (the user meant that file), rather than silently taking a later one.
    """
    entries = _scan()
    lead = f"{referrer}: " if referrer else ""
    for entry in entries:
        if entry.name == name and entry.problem is not None and entry.kind in (None, kind):
            raise ProfileError(f"{lead}{entry.problem}")
        if entry.name == name and entry.kind == kind:
            _warn_skipped(entries)
            return entry.path
    _warn_skipped(entries)
    index = _index(entries)
    for other in PROFILE_KINDS:
        if (other, name) in index:
            raise ProfileError(
                f"{lead}{name!r} is a {other} profile ({display_path(index[(other, name)])}), not a {kind} "
                f"profile; use load_{other if other != 'cluster' else 'cluster_spec'} or name a {kind} profile"
            )
    available = sorted(n for k, n in index if k == kind)
    search = ", ".join(str(p) for p in profile_search_path())
    raise ProfileError(
        f"{lead}no {kind} profile named {name!r}; available {kind}s: {', '.join(available) or '(none)'}; "
        f"search path: {search}"
    )


def _warn_skipped(entries: list[_Entry]) -> None:
    """One warning per unreadable file that a lookup passed over (a broken file is never skipped silently)."""
    for entry in entries:
        if entry.problem is not None:
            warnings.warn(f"skipping a profile that cannot be read: {entry.problem}", ProfileWarning, stacklevel=3)


def list_profiles() -> list[ProfileInfo]:
    """Every profile on the search path (shadowed duplicates omitted), sorted by kind then name.

    A file that cannot be read is skipped with a :class:`ProfileWarning` that names it and says why, so
    one broken user file neither hides the others nor disappears silently.
    """
    infos: list[ProfileInfo] = []
    seen: set[tuple[str, str]] = set()
    for entry in _scan():
        if entry.problem is not None:
            _warn_skipped([entry])
            continue
        try:
            data = read_toml(entry.path)
        except ProfileError as exc:
            warnings.warn(f"skipping a profile that cannot be read: {exc}", ProfileWarning, stacklevel=2)
            continue
        kind = str(entry.kind)
        if (kind, entry.name) in seen:
            continue
        seen.add((kind, entry.name))
        description = data.get("description", "")
        infos.append(ProfileInfo(kind=str(data.get("kind", kind)), name=entry.name,
                                 description=str(description), path=entry.path))
    order = {k: i for i, k in enumerate(PROFILE_KINDS)}
    return sorted(infos, key=lambda info: (order.get(info.kind, len(order)), info.name))
