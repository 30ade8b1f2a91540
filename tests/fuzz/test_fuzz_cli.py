"""Field-by-field fuzzing of real inputs through the CLI (issue 19): every run ends in success or in exit 2
with one error line; never a traceback, never more than a few seconds, never a partial output file.

Each test mutates one field of a real file (a GPU, node or cluster profile; a model file; a program file; a
sweep CSV; torch's schedule CSV) to a value a careless edit produces (wrong types, NaN, infinities, huge
integers, deep nesting, deletion) and runs the command that reads it. The example counts are fixed and the
search is derandomized, so the suite is deterministic and takes well under a minute.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.mutations import (
    DELETE,
    error_lines,
    leaves,
    real_profiles,
    replaced,
    run_cli,
    to_toml,
    toml_extras,
    values,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LIMIT_S = 8.0
"""Seconds one CLI call may take (the slowest sane case, a 16-GPU simulation, takes well under one)."""
PROFILES = real_profiles()
PROFILE_FIELDS = [(kind, path) for kind, data in PROFILES.items() for path in leaves(data)
                  if path not in (("gpu",), ("node",))]


def _check(tmp: Path, argv: list[str], out_dir: Path | None = None, *, json_out: bool = False) -> None:
    """Run and assert the contract: exit 0 or 2, one error line on 2, in time, no partial or stray outputs."""
    before = set(os.listdir(out_dir)) if out_dir is not None else set()
    start = time.monotonic()
    outcome = run_cli(argv, seconds=LIMIT_S)
    assert time.monotonic() - start < LIMIT_S
    assert outcome.code in (0, 2), (argv, outcome)
    if outcome.code == 2:
        lines = error_lines(outcome.stderr)
        if lines and lines[0].startswith("usage:"):
            lines = lines[-1:]
        assert len(lines) == 1 and "error" in lines[0], outcome.stderr
        if out_dir is not None:
            assert set(os.listdir(out_dir)) == before, "a failed command left files behind"
    elif out_dir is not None:
        assert not [f for f in set(os.listdir(out_dir)) - before if f.startswith(".")], "temporary file left"
    if outcome.code == 0 and json_out:
        def refuse(token: str) -> None:
            raise AssertionError(f"non-JSON {token} in --json output")

        data = json.loads(outcome.stdout, parse_constant=refuse)
        if isinstance(data, dict) and "step_time_s" in data:
            assert math.isfinite(data["step_time_s"]) and data["step_time_s"] > 0
            assert 0 <= data["mfu"] <= 1 and 0 <= data["bubble_fraction"] <= 1


def _files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fuzz")
    out = folder / "out"
    out.mkdir()
    return folder, out


@SETTINGS
@given(field=st.sampled_from(PROFILE_FIELDS), value=st.one_of(values, toml_extras))
def test_mutated_profiles(tmp_path_factory: pytest.TempPathFactory, field: tuple[str, tuple[str, ...]],
                          value: Any) -> None:
    """One field of a GPU, node or cluster profile changed; `simulate --json --trace` on 16 GPUs (2 nodes)."""
    folder, out = _files(tmp_path_factory)
    kind, path = field
    parts = dict(PROFILES)
    parts[kind] = replaced(PROFILES[kind], path, value)
    node = {**parts["node"], "gpu": "gpu.toml"} if isinstance(parts["node"].get("gpu"), str) else parts["node"]
    cluster = parts["cluster"]
    cluster = {**cluster, "node": "node.toml"} if isinstance(cluster.get("node"), str) else cluster
    for name, data in (("gpu", parts["gpu"]), ("node", node), ("cluster", cluster)):
        (folder / f"{name}.toml").write_text(to_toml(data))
    _check(folder, ["simulate", "--model", "tiny-gpt", "--cluster", str(folder / "cluster.toml"), "--gpus", "16",
                    "--tp", "2", "--json", "--trace", str(out / "t.json")], out, json_out=True)


MODEL = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 160,
         "gated_mlp": True, "vocab_size": 512, "seq_length": 128, "tied_embeddings": False, "norm": "rmsnorm",
         "position": "rope", "bias": False}


MOE_MODEL = {**MODEL, "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 96,
                               "shared_expert_ffn_hidden_size": 0, "shared_expert_gate": False, "first_dense_layers": 0,
                               "normalize_top_k": True, "capacity_factor": None, "load_imbalance": 1.0}}
MODEL_FIELDS = [(False, path) for path in leaves(MODEL)] + [(True, path) for path in leaves(MOE_MODEL)]


@SETTINGS
@given(field=st.sampled_from(MODEL_FIELDS), value=values, command=st.sampled_from(["simulate", "memory", "program"]))
def test_mutated_model_files(tmp_path_factory: pytest.TempPathFactory, field: tuple[bool, tuple[str, ...]],
                             value: Any, command: str) -> None:
    """One field of a Llama-style model file, dense or with MoE layers, changed; simulate, memory or program
    reads it."""
    folder, out = _files(tmp_path_factory)
    moe, path = field
    (folder / "m.json").write_text(json.dumps(replaced(MOE_MODEL if moe else MODEL, path, value)))
    argv = [command, "--model", str(folder / "m.json")]
    if command == "simulate":
        argv += ["--cluster", "dgx-a100-hdr", "--gpus", "2", "--json"]
    if command == "program":
        argv += ["--out", str(out / "p.json")]
    _check(folder, argv, out, json_out=command == "simulate")


def _program() -> dict[str, Any]:
    from simgrid import Layout, build_program
    from simgrid.ir.jsonio import program_to_dict
    from simgrid.model import get_model

    return program_to_dict(build_program(get_model("tiny-gpt"), Layout(pp=2, global_batch_size=2)))


PROGRAM = _program()
TOKENS = [(rank, index, token) for rank, lines in enumerate(PROGRAM["ranks"]) for index, line in enumerate(lines)
          for token in line.split()[1:]][::7]


@SETTINGS
@given(token=st.sampled_from(TOKENS), value=st.one_of(st.text(max_size=8), st.integers(), st.sampled_from(
    ["1" * 5000, str(10**40), "nan", "inf", "-1", "1e400", ""])), top=st.sampled_from([None, *PROGRAM]),
    top_value=values)
def test_mutated_program_files(tmp_path_factory: pytest.TempPathFactory, token: tuple[int, int, str], value: Any,
                               top: str | None, top_value: Any) -> None:
    """One field of one op line, or one top-level key, changed; `validate-program` reads the file."""
    folder, _ = _files(tmp_path_factory)
    data = json.loads(json.dumps(PROGRAM))
    if top is None:
        rank, index, original = token
        key = original.split("=")[0]
        data["ranks"][rank][index] = data["ranks"][rank][index].replace(original, f"{key}={value}", 1)
    else:
        data = replaced(data, (top,), top_value)
    (folder / "p.json").write_text(json.dumps(data))
    _check(folder, ["validate-program", str(folder / "p.json")])


SWEEP = ("dp,tp,pp,vpp,zero,mbs,schedule,recompute,step_time_s,tokens_per_s,mfu,peak_memory_bytes,fits\n"
         "8,1,1,1,0,1,none,none,1.0,16000,0.40,17179869184,True\n"
         "4,2,1,1,0,1,none,none,1.1,15000,0.38,17179869185,True\n"
         "2,2,2,1,0,1,1f1b,none,1.2,14000,0.36,17179869186,False\n")


@SETTINGS
@given(row=st.integers(0, 3), column=st.integers(0, 12), value=st.one_of(
    st.text(alphabet=st.characters(blacklist_characters=",\n\r\"", blacklist_categories=("Cs",)), max_size=8),
    st.floats(allow_nan=True, allow_infinity=True).map(str), st.sampled_from(["1" * 5000, "", "-5", "True"])),
    kind=st.sampled_from(["ranking", "heatmap"]))
def test_mutated_sweep_csvs(tmp_path_factory: pytest.TempPathFactory, row: int, column: int, value: str,
                            kind: str) -> None:
    """One cell (header included) of a sweep table changed; `simgrid plot` draws it or refuses it."""
    folder, out = _files(tmp_path_factory)
    rows = [line.split(",") for line in SWEEP.splitlines()]
    rows[row][column] = value
    (folder / "s.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    _check(folder, ["plot", str(folder / "s.csv"), "--kind", kind, "--out", str(out / "o.png")], out)


@SETTINGS
@given(cells=st.lists(st.one_of(st.from_regex(r"\A[0-9]{1,3}(F|B|I|W|SEND_F|RECV_B)[0-9]{0,3}\Z"),
                                st.text(max_size=6), st.sampled_from(["1" * 5000 + "F0", "0F" + "9" * 30])),
                      min_size=1, max_size=6))
def test_mutated_torch_csvs(cells: list[str]) -> None:
    """torch's schedule CSV with arbitrary cells: parsed, or a ProgramError of one line; nothing else."""
    from simgrid.errors import SimgridError
    from simgrid.ir.torch_csv import actions_from_csv
    from tests.fuzz.mutations import time_limit

    text = ",".join(c.replace(",", " ").replace("\n", " ").replace('"', " ") for c in cells) + "\n"
    with time_limit(LIMIT_S):
        try:
            actions_from_csv(text, "s.csv")
        except SimgridError as exc:
            assert "\n" not in str(exc)


def test_deleting_every_profile_field_in_turn_is_handled() -> None:
    """Not random: each leaf of each profile deleted once (about 45 runs) refuses or answers cleanly."""
    import tempfile

    for kind, path in PROFILE_FIELDS:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            parts = dict(PROFILES)
            parts[kind] = replaced(PROFILES[kind], path, DELETE)
            node = {**parts["node"], "gpu": "gpu.toml"}
            cluster = {**parts["cluster"], "node": "node.toml"}
            for name, data in (("gpu", parts["gpu"]), ("node", node), ("cluster", cluster)):
                (folder / f"{name}.toml").write_text(to_toml(data))
            _check(folder, ["simulate", "--model", "tiny-gpt", "--cluster", str(folder / "cluster.toml"),
                            "--gpus", "2", "--json"], json_out=True)
