"""The bad-input corpus of ``benchmarks/fuzz_cli.py``: about 800 inputs a new user's mistakes produce.

Each :class:`Case` is one command line (``simgrid``, ``simgrid-exec``, or a Python reader for torch CSVs,
which no command reads) run in its own folder, with the files it needs written there and what a correct
program must do with it:

* ``reject``: the input is wrong; the only right answer is exit 2 with one line naming what to fix.
* ``either``: a rule-valid extreme or an ambiguous value; refusing it (exit 2, one line) and answering it
  are both right, but an answer must be sane (strict JSON, finite step time, MFU and bubble in [0, 1]).
* ``accept``: a valid input (the unmutated files) that must succeed.

Groups: real hardware profiles mutated field by field (GPU, node, cluster, measured tables) and file by
file (encodings, garbage, nesting, huge integers, directories, FIFOs, self references, the search path);
model files field by field and file by file; layout flags; program files (for ``validate-program`` and
``simgrid-exec run``); torch and op CSVs; sweep CSVs and traces for ``simgrid plot``; output paths (missing
or non-directory parents, a directory or FIFO as the target, a full disk); and executor flags.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "hardware_profiles"
HUGE_INT = "1" + "0" * 5000
"""A 5,001-digit integer literal (beyond Python's default int-string limit of 4,300 digits)."""
DEEP = 5000
"""Nesting depth of the deep-nesting cases (beyond Python's recursion limit)."""

SIM_ARGS = ["--model", "tiny-gpt", "--gpus", "16", "--tp", "2", "--json"]
"""A 16-GPU run (two 8-GPU nodes): exercises intra-node links, NICs and the network."""


@dataclass
class Case:
    """One input and what a correct program does with it."""

    group: str
    """Corpus group (profile, model, layout, program, torch-csv, plot, output, executor)."""
    name: str
    """What was done to the input."""
    argv: list[str]
    """Arguments of the tool (without the program name)."""
    expect: str = "reject"
    """``reject``, ``either`` or ``accept`` (see the module docstring)."""
    tool: str = "simgrid"
    """``simgrid``, ``simgrid-exec`` or ``api`` (a Python reader, see :attr:`api`)."""
    files: dict[str, bytes | str | None] = field(default_factory=dict)
    """Files to create in the case folder (``None``: a FIFO; a name ending in ``/``: a directory)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables (``{dir}`` is replaced by the case folder)."""
    fsize: int | None = None
    """RLIMIT_FSIZE in bytes: writes beyond it fail, as on a full disk."""
    json_out: bool = False
    """stdout must be strict JSON on success."""
    api: str | None = None
    """For ``tool == "api"``: ``module:function`` called with the text of ``input.csv``."""


# -- TOML writing with raw literals ----------------------------------------------------------------
class Raw(str):
    """A value written verbatim into the TOML (``nan``, a 5,000-digit integer, an inline table)."""


UnknownValue = Literal["raise", "quote"]
"""What :func:`to_toml` does with a value TOML has no type for (``None``, an object): ``raise`` a ``TypeError``
(the corpus: a case that builds one is a bug in the corpus) or ``quote`` its ``str()`` as a TOML string (the
hypothesis fuzz test in tests/fuzz, whose strategies draw ``None``)."""


def toml_value(value: Any, *, unknown: UnknownValue = "raise") -> str:
    """One TOML value: a :class:`Raw` verbatim, strings JSON-quoted (TOML basic strings accept that), non-finite
    floats as TOML's ``nan``/``inf``/``-inf``, lists and dicts inline."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else ("-inf" if value == -math.inf else repr(value)))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, unknown=unknown) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k) if unknown == 'quote' else k)} = {toml_value(v, unknown=unknown)}"
                                for k, v in value.items()) + " }"
    if unknown == "quote":
        return json.dumps(str(value))
    raise TypeError(type(value))


def to_toml(data: dict[str, Any], prefix: str = "", *, unknown: UnknownValue = "raise") -> str:
    """TOML text: scalars first, then sub-tables as ``[a.b]`` and arrays of tables as ``[[a.b]]`` (``unknown``:
    see :data:`UnknownValue`)."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in data.items():
        is_table = isinstance(value, dict) and not isinstance(value, Raw)
        is_table_array = isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
        if is_table or is_table_array:
            tables.append((key, value))
        else:
            lines.append(f"{json.dumps(key)} = {toml_value(value, unknown=unknown)}")
    text = "\n".join(lines) + "\n"
    for key, value in tables:
        path = f"{prefix}{json.dumps(key)}"
        if isinstance(value, dict):
            text += f"\n[{path}]\n" + to_toml(value, path + ".", unknown=unknown)
        else:
            for item in value:
                text += f"\n[[{path}]]\n" + to_toml(item, path + ".", unknown=unknown)
    return text


def _load(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _leaves(data: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in data.items():
        if key == "sources":
            continue
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    elif isinstance(value, _Rename):
        node[path[-1] + value.suffix] = node.pop(path[-1])
    else:
        node[path[-1]] = value
    return out


_DELETE = object()


@dataclass(frozen=True)
class _Rename:
    suffix: str


NUMBER_MUTATIONS: tuple[tuple[str, Any, str], ...] = (
    ("negative", -1, "reject"),
    ("zero", 0, "either"),
    ("text", "fast", "reject"),
    ("nan", Raw("nan"), "reject"),
    ("inf", Raw("inf"), "either"),
    ("huge-float", Raw("1e308"), "either"),
    ("subnormal", Raw("5e-324"), "either"),
    ("huge-int", Raw(HUGE_INT), "either"),
    ("bool", True, "reject"),
    ("array", [1, 2], "reject"),
    ("table", Raw("{ a = 1 }"), "reject"),
    ("missing", _DELETE, "either"),
    ("typo", _Rename("x"), "reject"),
)
TEXT_MUTATIONS: tuple[tuple[str, Any, str], ...] = (
    ("number", 3, "reject"),
    ("bool", False, "reject"),
    ("empty", "", "either"),
    ("unknown-name", "warp-drive-9000", "either"),
    ("array", ["a"], "reject"),
    ("missing", _DELETE, "either"),
    ("typo", _Rename("_"), "reject"),
)
ARRAY_MUTATIONS: tuple[tuple[str, Any, str], ...] = (
    ("empty", [], "either"),
    ("text-item", ["a", "b"], "reject"),
    ("nested", Raw("[" * 50 + "1" + "]" * 50), "reject"),
    ("huge-item", Raw(f"[1, {HUGE_INT}]"), "either"),
    ("nan-item", Raw("[nan, 1.0]"), "reject"),
    ("bool", True, "reject"),
)


CORE = ("negative", "text", "nan", "huge-int", "number", "unknown-name", "text-item", "nested")


def rotate(options: tuple[tuple[Any, ...], ...], core: tuple[str, ...], index: int, extra: int = 2) -> list[Any]:
    """The ``core`` options plus ``extra`` of the others, chosen round-robin by ``index``: every option is
    used across fields while the corpus stays near 800 cases."""
    chosen = [o for o in options if o[0] in core]
    rest = [o for o in options if o[0] not in core]
    if rest:
        chosen += [rest[(index * extra + k) % len(rest)] for k in range(min(extra, len(rest)))]
    return chosen


def _mutations(value: Any, index: int) -> list[tuple[str, Any, str]]:
    if isinstance(value, list):
        return rotate(ARRAY_MUTATIONS, CORE, index)
    if isinstance(value, str):
        return rotate(TEXT_MUTATIONS, CORE, index)
    return rotate(NUMBER_MUTATIONS, CORE, index)


# -- profiles ---------------------------------------------------------------------------------------
def _profile_set(gpu: dict[str, Any], node: dict[str, Any], cluster: dict[str, Any]) -> dict[str, str]:
    node = {**node, "gpu": "gpu.toml"} if isinstance(node.get("gpu"), str) else node
    cluster = {**cluster, "node": "node.toml"} if isinstance(cluster.get("node"), str) else cluster
    return {"gpu.toml": to_toml(gpu), "node.toml": to_toml(node), "cluster.toml": to_toml(cluster)}


def profile_cases() -> list[Case]:
    """Every leaf field of a GPU, node and cluster profile, mutated in turn, run through ``simulate``."""
    gpu = _load(PROFILES / "gpus" / "a100-80gb-sxm.toml")
    node = _load(PROFILES / "nodes" / "dgx-a100.toml")
    cluster = _load(PROFILES / "clusters" / "dgx-a100-hdr.toml")
    argv = ["simulate", *SIM_ARGS, "--cluster", "cluster.toml", "--offload", "--zero", "1"]
    cases = [Case("profile", "unmutated", argv, "accept", files=_profile_set(gpu, node, cluster), json_out=True)]
    for kind, data in (("gpu", gpu), ("node", node), ("cluster", cluster)):
        for index, (path, value) in enumerate(_leaves(data)):
            if path in (("node", ), ("gpu", )):
                continue  # references are covered by the reference cases
            for label, new, expect in _mutations(value, index):
                if path == ("kind",) and label in ("empty", "unknown-name"):
                    expect = "reject"
                mutated = _set(data, path, new)
                parts = {"gpu": gpu, "node": node, "cluster": cluster, kind: mutated}
                cases.append(Case("profile", f"{kind}.{'.'.join(path)}: {label}", argv, expect,
                                  files=_profile_set(parts["gpu"], parts["node"], parts["cluster"]), json_out=True))
    cases += measured_cases(cluster, node, gpu)
    return cases


def measured_cases(cluster: dict[str, Any], node: dict[str, Any], gpu: dict[str, Any]) -> list[Case]:
    """Calibrated ``[measured]`` tables: valid, falling with size, negative, duplicated, huge."""
    def rows(times: list[float]) -> dict[str, Any]:
        sizes = [1024, 65536, 1048576, 16777216]
        return {"collectives": [{"kind": "all_reduce", "group_size": 2, "bytes": s, "time_us": t}
                                for s, t in zip(sizes, times, strict=True)],
                "p2p": [{"bytes": s, "time_us": t} for s, t in zip(sizes, times, strict=True)]}

    argv = ["simulate", "--model", "tiny-gpt", "--gpus", "2", "--json", "--cluster", "cluster.toml"]
    good = [20.0, 60.0, 400.0, 6000.0]
    variants = (
        ("measured: valid", rows(good), "accept"),
        ("measured: times fall as size grows", rows([6000.0, 400.0, 60.0, 20.0]), "reject"),
        ("measured: last time falls", rows([20.0, 60.0, 400.0, 100.0]), "reject"),
        ("measured: negative time", rows([20.0, -60.0, 400.0, 6000.0]), "reject"),
        ("measured: nan time", rows([20.0, math.nan, 400.0, 6000.0]), "reject"),
        ("measured: huge time", rows([20.0, 60.0, 400.0, 1e300]), "either"),
        ("measured: zero times", rows([0.0, 0.0, 0.0, 0.0]), "either"),
        ("measured: duplicate rows", {"p2p": [{"bytes": 1, "time_us": 1.0}, {"bytes": 1, "time_us": 2.0}]}, "reject"),
        ("measured: unknown kind", {"collectives": [{"kind": "all_sum", "group_size": 2, "bytes": 1, "time_us": 1.0}]},
         "reject"),
        ("measured: huge bytes", {"p2p": [{"bytes": Raw(HUGE_INT), "time_us": 1.0}]}, "either"),
        ("measured: group 0", {"collectives": [{"kind": "all_reduce", "group_size": 0, "bytes": 1, "time_us": 1.0}]},
         "reject"),
        ("measured: not a table", Raw("[1, 2]"), "reject"),
        ("measured: compute key empty", {"compute": [{"key": "", "time_us": 1.0}]}, "reject"),
        ("measured: bandwidth 0", {"memory_bandwidth_GBps": 0}, "reject"),
    )
    cases = []
    for name, measured, expect in variants:
        files = _profile_set(gpu, node, {**cluster, "measured": measured})
        cases.append(Case("profile", name, argv, expect, files=files, json_out=True))
    return cases


def profile_file_cases() -> list[Case]:
    """Whole profile files that are not profiles: encodings, garbage, nesting, directories, FIFOs, cycles."""
    cluster_text = (PROFILES / "clusters" / "dgx-a100-hdr.toml").read_text(encoding="utf-8")
    latin = cluster_text.replace('description = "', 'description = "caf\u00e9 ').encode("latin-1")
    bodies: dict[str, tuple[bytes | str | None, str]] = {
        "latin-1": (latin, "reject"),
        "utf-16": (cluster_text.encode("utf-16"), "reject"),
        "utf-8 with BOM": (b"\xef\xbb\xbf" + cluster_text.encode(), "reject"),
        "garbage bytes": (bytes(range(256)) * 4, "reject"),
        "NUL bytes": (b"\x00" * 64, "reject"),
        "empty file": (b"", "reject"),
        "deep inline tables": ("x = " + "{a = " * DEEP + "1" + " }" * DEEP + "\n", "reject"),
        "deep arrays": ("x = " + "[" * DEEP + "1" + "]" * DEEP + "\n", "reject"),
        "5000-digit integer": (f"x = {HUGE_INT}\n", "reject"),
        "huge node count": (cluster_text.replace('node = "dgx-a100"', f'node = "dgx-a100"\nmax_nodes = {HUGE_INT}'),
                            "either"),
        "json instead of toml": ('{"kind": "cluster"}', "reject"),
        "only kind": ('kind = "cluster"\n', "reject"),
        "kind gpu": ('kind = "gpu"\n', "reject"),
        "kind list": ('kind = ["cluster"]\n', "reject"),
        "duplicate key": ('name = "again"\n' + cluster_text, "reject"),
        "truncated": (cluster_text[: len(cluster_text) // 2], "reject"),
        "a FIFO": (None, "reject"),
    }
    cases = []
    argv = ["simulate", "--model", "tiny-gpt", "--gpus", "2", "--cluster", "c.toml"]
    for name, (body, expect) in bodies.items():
        cases.append(Case("profile-file", f"--cluster file: {name}", argv, expect, files={"c.toml": body}))
    # A cluster referring to itself, to another cluster, nodes referring to themselves, reference cycles.
    node_text = (PROFILES / "nodes" / "dgx-a100.toml").read_text(encoding="utf-8")
    refs = {
        "cluster node = itself (path)": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "c.toml"')},
        "cluster node = itself (name)": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "c"')},
        "cluster node = ./ (a directory)": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "./"')},
        "cluster node = a directory named .toml": {
            "c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "d.toml"'), "d.toml/": b""},
        "cluster node = a FIFO": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "n.toml"'),
                                  "n.toml": None},
        "node gpu = the node itself": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "n.toml"'),
                                       "n.toml": node_text.replace('gpu = "a100-80gb-sxm"', 'gpu = "n.toml"')},
        "node gpu = the cluster": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "n.toml"'),
                                   "n.toml": node_text.replace('gpu = "a100-80gb-sxm"', 'gpu = "c.toml"')},
        "inline node with node key": {"c.toml": cluster_text.replace('node = "dgx-a100"\n', "")
                                      + '\n[node]\nnode = "c.toml"\n'},
        "node path too long": {"c.toml": cluster_text.replace('node = "dgx-a100"', f'node = "{"n" * 5000}.toml"')},
        "node path through a file": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "c.toml/x.toml"')},
        "node name with NUL": {"c.toml": cluster_text.replace('node = "dgx-a100"', 'node = "a\\u0000b"')},
    }
    for name, files in refs.items():
        cases.append(Case("profile-file", name, argv, "reject", files=files))
    # --cluster values that are not profile files.
    for name, value, files in (
        ("a directory", ".", {}),
        ("a directory by name", "d", {"d/": b""}),
        ("a directory named x.toml", "x.toml", {"x.toml/": b""}),
        ("a FIFO", "f.toml", {"f.toml": None}),
        ("an empty name", "", {}),
        ("a 5000-character name", "c" * 5000, {}),
        ("a path through a file", "c.toml/x.toml", {"c.toml": cluster_text}),
        ("a missing file", "missing.toml", {}),
        ("a GPU profile", "a100-80gb-sxm", {}),
        ("an unknown name", "dgx-z9000", {}),
    ):
        cases.append(Case("profile-file", f"--cluster {name}", [*argv[:-1], value], "reject", files=files))
    cases += search_path_cases(cluster_text)
    return cases


def search_path_cases(cluster_text: str) -> list[Case]:
    """Bad files on ``$SIMGRID_PROFILE_PATH`` must not break built-in lookups (or block on a FIFO)."""
    env = {"SIMGRID_PROFILE_PATH": "{dir}/p", "HOME": "{dir}"}
    bad = {
        "a FIFO named x.toml": {"p/x.toml": None},
        "a directory named x.toml": {"p/x.toml/": b""},
        "a FIFO in clusters/": {"p/clusters/x.toml": None},
        "a malformed file": {"p/x.toml": "kind = \n"},
        "a non-UTF-8 file": {"p/x.toml": b"kind = \"cluster\"\nname = \"\xe9\"\n"},
        "a deep-nesting file": {"p/x.toml": "x = " + "[" * DEEP + "]" * DEEP + "\n"},
        "a 5000-digit integer": {"p/x.toml": f"kind = \"gpu\"\nx = {HUGE_INT}\n"},
        "a malformed file in nodes/": {"p/nodes/x.toml": "= =\n"},
        "a broken symlink": {"p/x.toml@": b"/nonexistent/file.toml"},
    }
    cases = []
    for name, files in bad.items():
        cases.append(Case("search-path", f"{name}: profiles", ["profiles"], "either", files=files, env=env))
        cases.append(Case("search-path", f"{name}: built-in cluster", ["simulate", "--model", "tiny-gpt",
                          "--gpus", "2", "--cluster", "dgx-a100-hdr", "--json"], "accept", files=files, env=env,
                          json_out=True))
        cases.append(Case("search-path", f"{name}: load it by name", ["simulate", "--model", "tiny-gpt",
                          "--gpus", "2", "--cluster", "x"], "reject", files=files, env=env))
    shadow = {"p/dgx-a100-hdr.toml": "kind = = 1\n"}
    cases.append(Case("search-path", "a malformed file shadowing a built-in", ["simulate", "--model", "tiny-gpt",
                      "--gpus", "2", "--cluster", "dgx-a100-hdr"], "reject", files=shadow, env=env))
    cases.append(Case("search-path", "a valid user cluster", ["simulate", "--model", "tiny-gpt", "--gpus", "2",
                      "--cluster", "mine"], "accept", files={"p/mine.toml": cluster_text}, env=env))
    return cases


# -- models -----------------------------------------------------------------------------------------
INT_VALUES: tuple[tuple[str, str, str], ...] = (
    ("negative", "-1", "reject"), ("zero", "0", "reject"), ("text", '"12"', "reject"), ("float", "1.5", "reject"),
    ("bool", "true", "reject"), ("null", "null", "either"), ("array", "[4]", "reject"), ("object", "{}", "reject"),
    ("huge float", "1e308", "reject"), ("5000 digits", HUGE_INT, "reject"), ("10^9", "1000000000", "either"),
    ("10^18", "1000000000000000000", "either"), ("nan", "NaN", "reject"), ("infinity", "Infinity", "reject"),
)
BOOL_VALUES: tuple[tuple[str, str, str], ...] = (
    ("text no", '"no"', "reject"), ("int 2", "2", "reject"), ("null", "null", "reject"), ("int 0", "0", "reject"),
    ("text true", '"true"', "reject"), ("array", "[]", "reject"),
)
STR_VALUES: tuple[tuple[str, str, str], ...] = (
    ("number", "123", "reject"), ("null", "null", "reject"), ("empty", '""', "either"), ("bogus", '"bogus"', "either"),
    ("object", "{}", "reject"), ("bool", "false", "reject"),
)


def _model_json(data: dict[str, Any], key: str, literal: str) -> str:
    parts = [f"{json.dumps(k)}: {literal if k == key else json.dumps(v)}" for k, v in data.items()]
    return "{" + ", ".join(parts) + "}"


def model_cases() -> list[Case]:
    """A GPT-style and a Llama-style model file, every field given wrong types and extreme values."""
    gpt = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": None,
           "ffn_hidden_size": None, "gated_mlp": False, "vocab_size": 512, "seq_length": 128,
           "tied_embeddings": True, "norm": "layernorm", "position": "learned", "bias": True}
    llama = {**gpt, "num_kv_heads": 2, "ffn_hidden_size": 160, "gated_mlp": True, "tied_embeddings": False,
             "norm": "rmsnorm", "position": "rope", "bias": False}
    argv = ["simulate", "--model", "m.json", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--json"]
    cases = [Case("model", "gpt unmutated", argv, "accept", files={"m.json": json.dumps(gpt)}, json_out=True),
             Case("model", "llama unmutated", argv, "accept", files={"m.json": json.dumps(llama)}, json_out=True)]
    for label, base in (("gpt", gpt), ("llama", llama)):
        for index, (key, value) in enumerate(base.items()):
            if isinstance(value, bool):
                values = BOOL_VALUES
            elif isinstance(value, str):
                values = STR_VALUES
            else:
                values = INT_VALUES
            core = ("negative", "text", "5000 digits", "10^9", "text no", "int 2", "null", "number", "bogus")
            for name, literal, expect in rotate(values, core, index):
                if key in ("norm", "position") and name in ("empty", "bogus"):
                    expect = "reject"
                if key in ("num_kv_heads", "ffn_hidden_size") and name == "null":
                    expect = "accept"
                if name == "null" and values is INT_VALUES and key not in ("num_kv_heads", "ffn_hidden_size"):
                    expect = "reject"
                if label == "llama" and values is INT_VALUES and name not in ("10^9", "10^18", "5000 digits"):
                    continue  # the GPT file covers type errors; the Llama file the extremes
                text = _model_json(base, key, literal)
                cases.append(Case("model", f"{label}.{key}: {name}", argv, expect, files={"m.json": text},
                                  json_out=True))
        cases.append(Case("model", f"{label}: unknown field", argv, "reject",
                          files={"m.json": json.dumps({**base, "layers": 4})}))
        cases.append(Case("model", f"{label}: missing num_layers", argv, "reject",
                          files={"m.json": json.dumps({k: v for k, v in base.items() if k != "num_layers"})}))
    text = json.dumps(gpt)
    for name, body in (
        ("latin-1", json.dumps({**gpt, "name": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")),
        ("utf-16", text.encode("utf-16")),
        ("garbage", bytes(range(256))),
        ("empty", b""),
        ("a list", "[1, 2]"),
        ("a number", "42"),
        ("deep nesting", "[" * 100000 + "]" * 100000),
        ("deep nesting in a field", text.replace('"m"', "[" * 100000 + "]" * 100000)),
        ("5000-digit integer", text.replace('"num_layers": 4', f'"num_layers": {HUGE_INT}')),
        ("truncated", text[:20]),
        ("a FIFO", None),
        ("NaN literal", text.replace('"num_layers": 4', '"num_layers": NaN')),
    ):
        cases.append(Case("model-file", f"model file: {name}", argv, "reject", files={"m.json": body}))
    for name, value, files in (
        ("a directory", "m.json", {"m.json/": b""}),
        ("a missing file", "none.json", {}),
        ("a path through a file", "x.json/m.json", {"x.json": text}),
        ("a 5000-character name", "m" * 5000 + ".json", {}),
    ):
        cases.append(Case("model-file", f"--model {name}", [argv[0], "--model", value, *argv[3:]], "reject",
                          files=files))
    for cmd in ("memory", "program"):
        extra = ["--out", "p.json"] if cmd == "program" else []
        for name, literal, expect in (("1e9 layers", "1000000000", "either"), ("bool gated", '"no"', "reject"),
                                      ("huge hidden", "1" + "0" * 30, "either")):
            key = "num_layers" if "layers" in name else ("gated_mlp" if "gated" in name else "hidden_size")
            cases.append(Case("model", f"{cmd}: {name}", [cmd, "--model", "m.json", *extra], expect,
                              files={"m.json": _model_json(gpt, key, literal)}))
    return cases


def all_cases(groups: tuple[str, ...] | None = None) -> list[Case]:
    """The whole corpus, or the named groups of builders."""
    from fuzz_corpus_cli import (
        executor_cases,
        layout_cases,
        output_cases,
        plot_cases,
        program_cases,
        serve_cases,
        torch_csv_cases,
    )

    builders: dict[str, Callable[[], list[Case]]] = {
        "profile": profile_cases, "profile-file": profile_file_cases, "model": model_cases,
        "layout": layout_cases, "program": program_cases, "torch-csv": torch_csv_cases, "plot": plot_cases,
        "output": output_cases, "serve": serve_cases, "executor": executor_cases,
    }
    cases: list[Case] = []
    for name, build in builders.items():
        if groups is None or name in groups:
            cases += build()
    return cases


def materialise(case: Case, folder: Path) -> None:
    """Create the case's files in ``folder`` (FIFOs for ``None``, folders for names ending in ``/``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in case.files.items():
        path = folder / name.rstrip("/@")
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        elif name.endswith("@"):
            os.symlink(body.decode() if isinstance(body, bytes) else str(body), path)
        elif body is None:
            os.mkfifo(path)
        elif isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body, encoding="utf-8")
