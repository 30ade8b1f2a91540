"""Program value semantics, lookups, and whole-program JSON files (round trip, atomic write, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_programs import gpipe_two_stages, hybrid_tp_pp, one_f_one_b_two_stages, program
from ir_strategies import any_op

from simgrid.errors import ProgramError
from simgrid.ir import (
    Collective,
    Program,
    Send,
    Wait,
    load_program,
    program_from_json,
    program_to_dict,
    program_to_json,
    save_program,
)
from simgrid.ir.ops import Op
from simgrid.ir.program import LazyRanks


def test_programs_with_equal_fields_are_equal_and_hash_equal() -> None:
    """Programs are plain values: groups/meta order does not matter, lists become tuples."""
    a = Program(groups={"b": [1, 0], "a": (0,)}, ranks=[[], [Wait(handle="h")]], meta={"z": 1, "a": "x"})
    b = Program(groups={"a": (0,), "b": (1, 0)}, ranks=((), (Wait(handle="h"),)), meta={"a": "x", "z": 1})
    assert a == b
    assert hash(a) == hash(b)
    assert list(a.groups) == ["a", "b"]
    assert a.groups["b"] == (1, 0)
    assert a != Program(groups=a.groups, ranks=((), ()), meta=a.meta)


def test_lookups() -> None:
    """world_size, ops, op, handle lookup, collectives of a group, groups of a rank."""
    p = hybrid_tp_pp()
    assert p.world_size == 4
    assert p.num_ops == sum(len(ops) for ops in p.ranks)
    assert p.op(2, 0) == p.ops(2)[0]
    send = p.op_by_handle(0, "sF")
    assert isinstance(send, Send) and send.peer == 2
    assert p.handle_index(0, "sF") == 4
    found = list(p.collectives("tp/pp1-dp0"))
    assert [(r, i) for r, i, _ in found] == [(2, 4), (2, 7), (3, 4), (3, 7)]
    assert all(isinstance(op, Collective) for _, _, op in found)
    assert [i for _, i, _ in p.collectives("tp/pp1-dp0", rank=3)] == [4, 7]
    assert "tp/pp0-dp0" in p.groups_of(1)
    assert p.mesh is not None and p.mesh.coords(3).tp == 1


def test_lookup_errors_name_what_is_missing() -> None:
    """Out-of-range ranks, unknown handles and unknown groups raise ProgramError."""
    p = gpipe_two_stages()
    with pytest.raises(ProgramError, match=r"rank 5 is outside the world of 2 ranks"):
        p.ops(5)
    with pytest.raises(ProgramError, match=r"rank 0 issues no op with handle 'nope'"):
        p.op_by_handle(0, "nope")
    with pytest.raises(ProgramError, match=r"no process group named 'tp'; known groups: \(none\)"):
        p.group("tp")


def test_construction_checks_shape() -> None:
    """Non-op entries, bad group members, non-scalar meta and a world-size mismatch are refused."""
    with pytest.raises(ProgramError, match=r"ranks\[0\]\[1\] = 'WAIT handle=x' is not an IR op"):
        Program(ranks=[[Wait(handle="x"), "WAIT handle=x"]])  # type: ignore[list-item]
    with pytest.raises(ProgramError, match=r"group 'tp' member '1' must be an integer rank"):
        Program(groups={"tp": ["1"]})  # type: ignore[list-item]
    with pytest.raises(ProgramError, match=r"meta\['x'\] = \[1\] must be a JSON scalar"):
        Program(meta={"x": [1]})  # type: ignore[dict-item]
    layout = hybrid_tp_pp().layout
    with pytest.raises(ProgramError, match=r"layout has world size 4 .* but the program has 2 rank op lists"):
        Program(layout=layout, ranks=[[], []])


# -- JSON ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [gpipe_two_stages, one_f_one_b_two_stages, hybrid_tp_pp])
def test_json_round_trip_is_exact(build: object, tmp_path: Path) -> None:
    """program_from_json(program_to_json(p)) == p, through a file too (model and layout included)."""
    p = build()  # type: ignore[operator]
    assert program_from_json(program_to_json(p)) == p
    path = tmp_path / "p.json"
    save_program(p, path)
    assert load_program(path) == p
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]  # no temporary file left behind


@settings(max_examples=30)
@given(st.lists(st.lists(any_op, max_size=6), max_size=4), st.dictionaries(st.text(), st.none() | st.integers()))
def test_json_round_trip_of_random_op_lists(ranks: list[list[object]], meta: dict[str, object]) -> None:
    """Any op lists and scalar meta survive JSON exactly."""
    p = Program(ranks=ranks, meta=meta)  # type: ignore[arg-type]
    assert program_from_json(program_to_json(p)) == p


def test_json_shape() -> None:
    """The file carries format, version, model, layout, meta, groups and op lines per rank."""
    data = json.loads(program_to_json(hybrid_tp_pp()))
    assert data["format"] == "simgrid-program" and data["version"] == 1
    assert data["model"]["name"] == "tiny" and data["layout"]["tp"] == 2
    assert data["groups"]["tp/pp0-dp0"] == [0, 1]
    assert data["ranks"][0][0] == "ALLOC name=act bytes=32 category=activations"
    assert data["meta"] == {"mb": 1, "schedule": "gpipe"}


def _bad(mutate: object) -> str:
    data = program_to_dict(hybrid_tp_pp())
    mutate(data)  # type: ignore[operator]
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"^bad\.json: not valid JSON \(.* at line 1, column 2\)"),
        ("[]", r"^bad\.json: top level must be a JSON object"),
        (_bad(lambda d: d.update(format="other")), r"format = 'other'; expected 'simgrid-program'"),
        (_bad(lambda d: d.update(version=9)), r"version = 9; this simgrid reads version 1; regenerate"),
        (_bad(lambda d: d.pop("groups")), r"missing key\(s\) groups"),
        (_bad(lambda d: d.update(extra=1)), r"unknown key\(s\) extra"),
        (_bad(lambda d: d["ranks"][3].__setitem__(2, "ALLOC name=x")),
         r"^bad\.json: ranks\[3\]\[2\] \(rank 3, op 2\): cannot parse op 'ALLOC name=x': ALLOC is missing field"),
        (_bad(lambda d: d["ranks"][1].__setitem__(0, 7)), r"ranks\[1\]\[0\] \(rank 1, op 0\): op must be a text line"),
        (_bad(lambda d: d["model"].update(num_layers=0)),
         r"^bad\.json: model: .*num_layers = 0 must be a positive integer; fix the model object or set it to null"),
        (_bad(lambda d: d["layout"].update(pipes=2)), r"^bad\.json: layout: layout has unknown field\(s\) \['pipes'\]"),
        (_bad(lambda d: d["layout"].update(tp=1)),
         r"^bad\.json: program: the layout has world size 2 .* but the program has 4 rank op lists"),
        (_bad(lambda d: d.update(meta={"a": [1]})), r"meta\['a'\] = \[1\] must be a scalar"),
        (_bad(lambda d: d.update(groups={"g": "01"})), r"groups\['g'\] = '01' must be a list of integer ranks"),
    ],
)
def test_bad_files_name_file_path_and_fix(text: str, match: str) -> None:
    """Malformed program files raise ProgramError naming the file, the JSON path and the fix."""
    with pytest.raises(ProgramError, match=match):
        program_from_json(text, "bad.json")


def test_load_missing_file(tmp_path: Path) -> None:
    """A missing file is a ProgramError, not a traceback."""
    with pytest.raises(ProgramError, match=r"program file .*absent\.json does not exist; check the path"):
        load_program(tmp_path / "absent.json")


def test_failed_write_leaves_old_file_intact(tmp_path: Path) -> None:
    """Writing is atomic: a program that cannot be serialised leaves the previous file and no temp file."""
    path = tmp_path / "p.json"
    save_program(gpipe_two_stages(), path)
    before = path.read_bytes()
    with pytest.raises(ProgramError, match=r"replace NaN/infinite values"):
        save_program(program([["FREE name=a"]], meta={"x": float("nan")}), path)
    assert path.read_bytes() == before
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]


def test_programs_pickle_and_copy() -> None:
    """Programs pickle (executor workers receive them) and deep-copy to equal values."""
    import copy
    import pickle

    p = hybrid_tp_pp()
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.deepcopy(p) == p


def test_ir_imports_neither_torch_nor_simpy() -> None:
    """simgrid.ir is shared by the simulator and the executor, so it must load without either runtime."""
    import subprocess
    import sys

    code = "import sys, simgrid.ir; bad = {'torch', 'simpy'} & set(sys.modules); assert not bad, bad"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _lazy_pair() -> tuple[Program, Program, list[int]]:
    """An eager program and the same program whose ranks are made on demand (calls recorded)."""
    ranks = (
        (Send(peer=1, bytes=4, key="x", handle="s"), Wait(handle="s")),
        (Wait(handle="h"),),
        (),
    )
    calls: list[int] = []

    def make(rank: int) -> tuple[Op, ...]:
        calls.append(rank)
        return ranks[rank]

    lazy = Program(groups={"world": (0, 1, 2)}, ranks=LazyRanks(make, [len(r) for r in ranks]))
    return Program(groups={"world": (0, 1, 2)}, ranks=ranks), lazy, calls


def test_lazy_ranks_are_made_once_on_first_access_and_num_ops_needs_none() -> None:
    """A LazyRanks program makes a rank the first time it is read, keeps it, and counts ops from the
    announced lengths without making anything."""
    eager, lazy, calls = _lazy_pair()
    assert lazy.world_size == 3 and lazy.num_ops == 3 and calls == []
    assert lazy.ops(1) == (Wait(handle="h"),)
    assert lazy.ranks[1] is lazy.ranks[-2]
    assert calls == [1]
    assert lazy.handle_index(0, "s") == 0 and calls == [1, 0]
    assert lazy.ranks[0:2] == eager.ranks[0:2]
    with pytest.raises(IndexError):
        lazy.ranks[3]


def test_lazy_program_equals_hashes_and_pickles_like_the_eager_one() -> None:
    """Equality and hash are those of the tuple of all ranks, in either order of comparison; pickling
    gives an eager program equal to both."""
    import pickle

    eager, lazy, _ = _lazy_pair()
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    assert pickle.loads(pickle.dumps(lazy)) == eager
    other = Program(groups={"world": (0, 1, 2)}, ranks=((), (Wait(handle="h"),), ()))
    assert lazy != other and other != lazy


def test_lazy_ranks_check_what_they_make() -> None:
    """A made rank that is not a tuple of IR ops, or whose length differs from the one announced, is a
    ProgramError naming the rank."""
    bad = Program(ranks=LazyRanks(lambda rank: ("not an op",), [1]))  # type: ignore[arg-type,return-value]
    with pytest.raises(ProgramError, match=r"ranks\[0\]\[0\] = 'not an op' is not an IR op"):
        bad.ops(0)
    short = Program(ranks=LazyRanks(lambda rank: (), [2]))
    with pytest.raises(ProgramError, match=r"ranks\[0\] has 0 ops but 2 were announced"):
        short.ops(0)
