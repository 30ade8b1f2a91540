"""Where profiles live and how a name finds its file.

Search order (first match wins): each folder in ``$SIMGRID_PROFILE_PATH`` (``os.pathsep``-separated),
then ``~/.config/simgrid/profiles``, then the built-in folder: ``<repo>/hardware_profiles`` for a clone
or editable install, else ``<prefix>/share/llm-simgrid/hardware_profiles`` where pyproject's
data-files put it for a wheel install. In any folder a profile may sit in ``gpus/``, ``nodes/``,
``clusters/`` or directly in the folder; a profile's name is its file name without ``.toml``.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from simgrid.errors import ProfileError

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
    """A path as error messages show it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):  # not under the working directory, or the directory is gone
        return str(path)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; malformed TOML or an unreadable file becomes a ProfileError naming the file."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{display_path(path)}: malformed TOML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"{display_path(path)}: cannot read profile: {exc.strerror or exc}") from None


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


def _candidate_files(folder: Path) -> list[tuple[str | None, Path]]:
    """(kind implied by the sub-folder or None, file) for every ``.toml`` in a search folder."""
    found: list[tuple[str | None, Path]] = []
    for kind in PROFILE_KINDS:
        sub = folder / f"{kind}s"
        if sub.is_dir():
            found.extend((kind, path) for path in sorted(sub.glob("*.toml")))
    if folder.is_dir():
        found.extend((None, path) for path in sorted(folder.glob("*.toml")))
    return found


def _file_kind(path: Path) -> str:
    kind = read_toml(path).get("kind")
    return kind if isinstance(kind, str) else "?"


def _index() -> dict[tuple[str, str], Path]:
    """(kind, name) -> file, first match on the search path winning."""
    index: dict[tuple[str, str], Path] = {}
    for folder in profile_search_path():
        for implied_kind, path in _candidate_files(folder):
            kind = implied_kind or _file_kind(path)
            index.setdefault((kind, path.stem), path)
    return index


def find_profile(name: str, kind: str, *, referrer: str = "") -> Path:
    """The file of profile ``name`` of ``kind``; a clear error for wrong kinds and unknown names.

    ``referrer`` (e.g. ``"nodes/x.toml: gpu = 'foo'"``) prefixes the message when another profile
    refers to the missing one.
    """
    index = _index()
    if (kind, name) in index:
        return index[(kind, name)]
    lead = f"{referrer}: " if referrer else ""
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


def list_profiles() -> list[ProfileInfo]:
    """Every profile on the search path (shadowed duplicates omitted), sorted by kind then name.

    A malformed file raises a ProfileError naming it, rather than silently disappearing from the list.
    """
    infos: list[ProfileInfo] = []
    for (kind, name), path in _index().items():
        data = read_toml(path)
        description = data.get("description", "")
        infos.append(ProfileInfo(kind=str(data.get("kind", kind)), name=name,
                                 description=str(description), path=path))
    order = {k: i for i, k in enumerate(PROFILE_KINDS)}
    return sorted(infos, key=lambda info: (order.get(info.kind, len(order)), info.name))
