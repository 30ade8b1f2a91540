"""Corpus builders for command lines, program files, CSVs and output paths (see ``fuzz_corpus.py``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from fuzz_corpus import _DELETE, HUGE_INT, Case, rotate


# -- layouts ----------------------------------------------------------------------------------------
def layout_cases() -> list[Case]:
    """Layout flags: extremes, rule violations and unparseable values, on simulate, memory, program, sweep."""
    base = ["simulate", "--cluster", "dgx-a100-hdr"]
    t12 = str(10**12)
    sim = [
        ("--gpus 10^12", ["--model", "gpt3-175b", "--gpus", t12], "either"),
        ("--dp 10^12 --gbs 10^12", ["--model", "tiny-gpt", "--dp", t12, "--gbs", t12], "either"),
        ("--gbs 10^12", ["--model", "tiny-gpt", "--gbs", t12], "either"),
        ("--gbs 10^9", ["--model", "tiny-gpt", "--gbs", str(10**9)], "either"),
        ("--gbs 10^12 --pp 2", ["--model", "tiny-gpt", "--pp", "2", "--gbs", t12], "either"),
        ("--mbs 10^9", ["--model", "tiny-gpt", "--mbs", str(10**9)], "either"),
        ("--mbs 10^18", ["--model", "tiny-gpt", "--mbs", str(10**18)], "either"),
        ("--seq 10^9", ["--model", "tiny-gpt", "--seq", str(10**9)], "either"),
        ("--seq 10^18", ["--model", "gpt3-175b", "--seq", str(10**18)], "either"),
        ("--tp 10^9", ["--model", "tiny-gpt", "--tp", str(10**9)], "reject"),
        ("--pp 10^9", ["--model", "tiny-gpt", "--pp", str(10**9)], "reject"),
        ("--cp 10^9", ["--model", "tiny-gpt", "--cp", str(10**9)], "reject"),
        ("--vpp 10^6", ["--model", "tiny-gpt", "--pp", "2", "--vpp", str(10**6), "--schedule", "interleaved-1f1b"],
         "reject"),
        ("--params 1e30", ["--params", "1e30", "--gpus", "8"], "either"),
        ("--params 1e20", ["--params", "1e20", "--gpus", "8"], "either"),
        ("--params 1e15", ["--params", "1e15", "--gpus", "8"], "either"),
        ("--params 1e308", ["--params", "1e308", "--gpus", "8"], "either"),
        ("--params 1e-5", ["--params", "1e-5", "--gpus", "8"], "reject"),
        ("--params nan", ["--params", "nan", "--gpus", "8"], "reject"),
        ("--params inf", ["--params", "inf", "--gpus", "8"], "reject"),
        ("--params -7e9", ["--params", "-7e9", "--gpus", "8"], "reject"),
        ("--params 5000 digits", ["--params", HUGE_INT, "--gpus", "8"], "either"),
        ("--bucket-mb 1e-300", ["--model", "tiny-gpt", "--gpus", "2", "--bucket-mb", "1e-300"], "either"),
        ("--bucket-mb 1e300", ["--model", "tiny-gpt", "--gpus", "2", "--bucket-mb", "1e300"], "either"),
        ("--bucket-mb nan", ["--model", "tiny-gpt", "--gpus", "2", "--bucket-mb", "nan"], "reject"),
        ("--gpus 0", ["--model", "tiny-gpt", "--gpus", "0"], "reject"),
        ("--gpus -8", ["--model", "tiny-gpt", "--gpus", "-8"], "reject"),
        ("--gpus abc", ["--model", "tiny-gpt", "--gpus", "abc"], "reject"),
        ("--gpus 5000 digits", ["--model", "tiny-gpt", "--gpus", HUGE_INT], "reject"),
        ("--gpus 8.0", ["--model", "tiny-gpt", "--gpus", "8.0"], "reject"),
        ("--gpus empty", ["--model", "tiny-gpt", "--gpus", ""], "reject"),
        ("--gpus 3 --tp 2", ["--model", "tiny-gpt", "--gpus", "3", "--tp", "2"], "reject"),
        ("--tp 3 (heads 4)", ["--model", "tiny-gpt", "--tp", "3"], "reject"),
        ("--pp 64 (4 layers)", ["--model", "tiny-gpt", "--pp", "64"], "reject"),
        ("--zero 3 --pp 2", ["--model", "tiny-gpt", "--pp", "2", "--zero", "3"], "reject"),
        ("--zero 4", ["--model", "tiny-gpt", "--zero", "4"], "reject"),
        ("--sequence-parallel tp 1", ["--model", "tiny-gpt", "--sequence-parallel"], "reject"),
        ("--cp 3", ["--model", "tiny-gpt", "--cp", "3"], "reject"),
        ("--vpp 2 with 1f1b", ["--model", "tiny-gpt", "--pp", "2", "--vpp", "2", "--schedule", "1f1b"], "reject"),
        ("--schedule bogus", ["--model", "tiny-gpt", "--schedule", "bogus"], "reject"),
        ("--gbs 3 --dp 2", ["--model", "tiny-gpt", "--dp", "2", "--gbs", "3"], "reject"),
        ("--dp 2 --gpus 8", ["--model", "tiny-gpt", "--dp", "2", "--gpus", "8"], "reject"),
        ("--model unknown", ["--model", "gpt-5"], "reject"),
        ("--model empty", ["--model", ""], "reject"),
        ("--mode full 4096 GPUs block", ["--model", "gpt3-175b", "--gpus", "4096", "--tp", "8", "--pp", "8",
                                         "--mode", "full", "--granularity", "block", "--gbs", "4096"], "either"),
        ("--granularity block 10^6 micro-batches", ["--model", "tiny-gpt", "--gbs", str(10**6),
                                                    "--granularity", "block"], "either"),
        ("--gpus 2^20", ["--model", "gpt3-175b", "--gpus", str(2**20), "--tp", "8", "--pp", "8"], "either"),
        ("--offload --dp-mode parameter-server --zero 1", ["--model", "tiny-gpt", "--gpus", "2", "--offload",
                                                           "--dp-mode", "parameter-server", "--zero", "1"], "reject"),
    ]
    cases = [Case("layout", f"simulate {name}", base + args, expect) for name, args, expect in sim]
    for name, args, expect in (
        ("--gbs 10^12", ["--model", "tiny-gpt", "--gbs", t12], "either"),
        ("--dp 10^12", ["--model", "tiny-gpt", "--dp", t12], "either"),
        ("--params 1e30", ["--params", "1e30"], "either"),
        ("--seq 10^18", ["--model", "tiny-gpt", "--seq", str(10**18)], "either"),
        ("--gpu a directory", ["--model", "tiny-gpt", "--gpu", "."], "reject"),
        ("--gpu a cluster", ["--model", "tiny-gpt", "--gpu", "dgx-a100-hdr"], "reject"),
        ("--max-gpus 10^12", ["--model", "llama2-7b", "--gpu", "rtx-4090", "--max-gpus", t12], "either"),
    ):
        cases.append(Case("layout", f"memory {name}", ["memory", *args], expect))
    for name, args, expect in (
        ("--gbs 10^12", ["--model", "tiny-gpt", "--gbs", t12], "either"),
        ("--dp 10^12", ["--model", "tiny-gpt", "--dp", t12], "either"),
        ("--dp 4096 --gbs 4096 block", ["--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "4096", "--gbs",
                                        "4096"], "either"),
        ("--params 1e30", ["--params", "1e30"], "either"),
    ):
        cases.append(Case("layout", f"program {name}", ["program", *args, "--out", "p.json"], expect))
    sweep = ["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--workers", "1", "--no-progress"]
    for name, args, expect in (
        ("--tp 3 (divides nothing)", ["--gpus", "8", "--gbs", "8", "--tp", "3"], "reject"),
        ("--tp 16 > gpus", ["--gpus", "8", "--gbs", "8", "--tp", "16"], "reject"),
        ("--dp 4 --pp 4 on 8 GPUs", ["--gpus", "8", "--gbs", "8", "--dp", "4", "--pp", "4"], "reject"),
        ("--dp 3 on 8 GPUs", ["--gpus", "8", "--gbs", "8", "--dp", "3"], "reject"),
        ("--pp 8 (4 layers)", ["--gpus", "8", "--gbs", "8", "--pp", "8"], "reject"),
        ("--gpus 10^12", ["--gpus", t12, "--gbs", "8"], "either"),
        ("--gbs 10^12", ["--gpus", "8", "--gbs", t12], "either"),
        ("--gbs 3 (no dp divides)", ["--gpus", "8", "--gbs", "3", "--dp", "2"], "reject"),
        ("--max-tp 0", ["--gpus", "8", "--gbs", "8", "--max-tp", "0"], "reject"),
        ("--mbs 0", ["--gpus", "8", "--gbs", "8", "--mbs", "0"], "reject"),
        ("--schedules bogus", ["--gpus", "8", "--gbs", "8", "--schedules", "bogus"], "reject"),
        ("--cp 3", ["--gpus", "8", "--gbs", "8", "--cp", "3"], "reject"),
        ("valid small", ["--gpus", "2", "--gbs", "4", "--tp", "1", "--zero", "0", "--recompute", "none", "--mbs", "1"],
         "accept"),
    ):
        cases.append(Case("layout", f"sweep {name}", sweep + args, expect))
    for name, args, expect in (
        ("--pp 10^9", ["--schedule", "1f1b", "--pp", str(10**9), "--microbatches", "8"], "either"),
        ("--microbatches 10^12", ["--schedule", "1f1b", "--pp", "2", "--microbatches", t12], "either"),
        ("--vpp 10^9", ["--schedule", "interleaved-1f1b", "--pp", "2", "--vpp", str(10**9), "--microbatches", "4"],
         "either"),
        ("zbv --vpp 3", ["--schedule", "zbv", "--pp", "2", "--vpp", "3", "--microbatches", "4"], "reject"),
        ("interleaved m not multiple", ["--schedule", "interleaved-1f1b", "--pp", "4", "--vpp", "2",
                                        "--microbatches", "3"], "either"),
    ):
        cases.append(Case("layout", f"schedule {name}", ["schedule", *args], expect))
    return cases


# -- program files ----------------------------------------------------------------------------------
def _program_json() -> dict[str, Any]:
    from simgrid.ir.jsonio import program_to_dict
    from simgrid.layout import Layout
    from simgrid.model import get_model
    from simgrid.schedules import build_program

    return program_to_dict(build_program(get_model("tiny-gpt"), Layout(pp=2, dp=1, global_batch_size=2)))


def _line_mutations(program: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """(name, original line, mutated line, expectation) for fields of real op lines."""
    seen: dict[str, str] = {}
    for lines in program["ranks"]:
        for line in lines:
            seen.setdefault(line.split()[0], line)
    values = (("10^40", str(10**40), "reject"), ("-1", "-1", "reject"), ("5000 digits", HUGE_INT, "reject"),
              ("text", "abc", "reject"), ("nan", "nan", "reject"), ("inf", "inf", "reject"),
              ("1e400", "1e400", "reject"), ("empty", "", "reject"))
    index = 0
    for mnemonic, line in seen.items():
        for token in line.split()[1:]:
            key, _, _ = token.partition("=")
            index += 1
            for name, value, expect in rotate(values, ("10^40", "5000 digits"), index, extra=1):
                if key in ("purpose", "category", "group") and name in ("text", "nan", "inf"):
                    continue  # a word here may be a valid name
                if key in ("name", "label", "handle"):
                    expect = "either"  # free-form names: any text is a name
                new_line = line.replace(token, f"{key}={value}", 1)
                yield f"{mnemonic}.{key}: {name}", line, new_line, expect


def program_cases() -> list[Case]:
    """A real program file, each op field and top-level key broken in turn, through validate-program."""
    program = _program_json()
    text = json.dumps(program)
    argv = ["validate-program", "p.json"]
    cases = [Case("program", "unmutated", argv, "accept", files={"p.json": text})]
    for name, line, new_line, expect in _line_mutations(program):
        mutated = copy.deepcopy(program)
        mutated["ranks"] = [[new_line if item == line else item for item in lines] for lines in mutated["ranks"]]
        cases.append(Case("program", f"op {name}", argv, expect, files={"p.json": json.dumps(mutated)}))
    for key in program:
        for name, value in (("null", None), ("number", 7), ("list", [1]), ("deleted", _DELETE)):
            mutated = copy.deepcopy(program)
            if value is _DELETE:
                del mutated[key]
            else:
                mutated[key] = value
            expect = "reject"
            if (key == "meta" and name == "object") or (key in ("model", "layout") and name == "null"):
                expect = "either"
            cases.append(Case("program", f"top-level {key}: {name}", argv, expect, files={"p.json": json.dumps(mutated)}))
    for name, edit in (
        ("group member 10^40", lambda p: p["groups"].update({"world": [0, 10**40]})),
        ("group member -1", lambda p: p["groups"].update({"world": [-1, 0]})),
        ("group member text", lambda p: p["groups"].update({"world": ["0", 1]})),
        ("group duplicate members", lambda p: p["groups"].update({"world": [0, 0]})),
        ("group empty", lambda p: p["groups"].update({"world": []})),
        ("no ranks", lambda p: p.update({"ranks": []})),
        ("extra empty rank", lambda p: p["ranks"].append([])),
        ("rank not a list", lambda p: p["ranks"].__setitem__(0, "F stage=0")),
        ("op not a string", lambda p: p["ranks"][0].__setitem__(0, 7)),
        ("garbage op", lambda p: p["ranks"][0].__setitem__(0, "\x00\x01garbage")),
        ("unknown op", lambda p: p["ranks"][0].__setitem__(0, "TELEPORT peer=1")),
        ("dropped SEND", lambda p: p["ranks"][0].remove(next(x for x in p["ranks"][0] if x.startswith("SEND")))),
        ("layout tp text", lambda p: p["layout"].update({"tp": "2"})),
        ("layout dp 10^12", lambda p: p["layout"].update({"dp": 10**12})),
        ("model layers 10^9", lambda p: p["model"].update({"num_layers": 10**9})),
        ("model gated no", lambda p: p["model"].update({"gated_mlp": "no"})),
        ("version 10^40", lambda p: p.update({"version": 10**40})),
        ("meta nested", lambda p: p["meta"].update({"x": {"y": 1}})),
    ):
        mutated = copy.deepcopy(program)
        edit(mutated)
        cases.append(Case("program", name, argv, "reject", files={"p.json": json.dumps(mutated)}))
    for name, body in (
        ("latin-1", text.replace('"tiny-gpt"', '"caf\u00e9"').encode("latin-1")),
        ("utf-16", text.encode("utf-16")),
        ("garbage", bytes(range(256)) * 8),
        ("empty", b""),
        ("deep nesting", "[" * 100000 + "]" * 100000),
        ("deep nesting in meta", text.replace('"generator"', '"x": ' + "[" * 100000 + "]" * 100000 + ', "generator"')),
        ("5000-digit version", text.replace('"version": 1', f'"version": {HUGE_INT}')),
        ("NaN in layout", text.replace('"bucket_size_MB": 25.0', '"bucket_size_MB": NaN')),
        ("a FIFO", None),
    ):
        cases.append(Case("program-file", f"program file: {name}", argv, "reject", files={"p.json": body}))
    cases.append(Case("program-file", "program file: a directory", argv, "reject", files={"p.json/": b""}))
    cases.append(Case("program-file", "program file: missing", ["validate-program", "none.json"], "reject"))
    return cases


# -- torch CSVs (Python readers: no command reads them) ---------------------------------------------
def torch_csv_cases() -> list[Case]:
    """torch's schedule CSV and our op CSV with broken cells, through the readers."""
    good_actions = "0F0,0F1,0B0,0B1\n,1F0,1B0,1F1,1B1\n"
    cases = [Case("torch-csv", "actions: valid", [], "accept", tool="api", api="simgrid.ir.torch_csv:actions_from_csv",
                  files={"input.csv": good_actions})]
    for name, body, expect in (
        ("huge stage", f"{HUGE_INT}F0\n", "reject"),
        ("stage 10^40", f"{10**40}F0\n", "either"),
        ("negative stage", "-1F0\n", "reject"),
        ("unknown type", "0X0\n", "reject"),
        ("missing micro-batch", "0F\n", "reject"),
        ("micro-batch on UNSHARD", "0UNSHARD3\n", "reject"),
        ("overlap cell", "(0F1;1B0)OVERLAP_F_B\n", "either"),
        ("garbage bytes", "\x00\x01\x02\n", "reject"),
        ("unterminated quote", '"0F0,0F1\n', "either"),
        ("huge micro-batch", f"0F{HUGE_INT}\n", "reject"),
        ("empty", "", "either"),
        ("only commas", ",,,,\n,,\n", "either"),
        ("very long row", ",".join(["0F0"] * 100000) + "\n", "either"),
        ("a 1 MB cell", "0F" + "0" * 1_000_000 + "\n", "reject"),
        ("spaces", " 0F0 , 1B0 \n", "either"),
    ):
        cases.append(Case("torch-csv", f"actions: {name}", [], expect, tool="api",
                          api="simgrid.ir.torch_csv:actions_from_csv", files={"input.csv": body}))
    # The same files through the commands that read them (--pipeline-csv).
    order = "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n"
    readers = (["schedule", "--pipeline-csv", "s.csv"],
               ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--pipeline-csv", "s.csv"])
    for argv in readers:
        cases.append(Case("torch-csv", f"{argv[0]} --pipeline-csv: valid", argv, "accept", files={"s.csv": order}))
        for name, body, expect in (
            ("a FIFO", None, "reject"), ("latin-1", "0F0,\xe9\n".encode("latin-1"), "reject"),
            ("utf-16", order.encode("utf-16"), "reject"), ("empty", "", "reject"),
            ("huge stage", f"{HUGE_INT}F0\n", "reject"), ("stage 10^8", "100000000F0\n", "reject"),
            ("a 1 MB cell", "0F" + "0" * 1_000_000 + "\n", "reject"), ("garbage", bytes(range(256)), "reject"),
            ("three stages on two rows", "0F0,2F0\n1F0\n", "reject"),
        ):
            if argv[0] == "schedule" and name == "three stages on two rows":
                expect = "either"  # drawing an odd order is fine; running it is not
            cases.append(Case("torch-csv", f"{argv[0]} --pipeline-csv: {name}", argv, expect, files={"s.csv": body}))
    cases.append(Case("torch-csv", "--pipeline-csv a directory", list(readers[0]), "reject", files={"s.csv/": b""}))
    cases.append(Case("torch-csv", "simgrid-exec run --pipeline-csv huge stage", ["run", "--pipeline-csv", "s.csv"],
                      "reject", tool="simgrid-exec", files={"s.csv": f"{HUGE_INT}F0\n"}))
    good_ops = "F stage=0 mb=0 chunk=0 blocks=0:1 flops=1.0 hbm=1.0,WAIT handle=h\n"
    for name, body, expect in (
        ("valid", good_ops, "accept"),
        ("bytes 10^40", f"SEND peer=1 bytes={10**40} key=0>1:F:0 handle=h\n", "reject"),
        ("bytes 5000 digits", f"SEND peer=1 bytes={HUGE_INT} key=0>1:F:0 handle=h\n", "reject"),
        ("flops nan", "F stage=0 mb=0 chunk=0 blocks=0:1 flops=nan hbm=1.0\n", "reject"),
        ("flops inf", "F stage=0 mb=0 chunk=0 blocks=0:1 flops=inf hbm=1.0\n", "reject"),
        ("blocks reversed", "F stage=0 mb=0 chunk=0 blocks=5:1 flops=1.0 hbm=1.0\n", "either"),  # validation's job
        ("unknown op", "JUMP x=1\n", "reject"),
        ("quoted garbage", 'F label="\\ud800"\n', "reject"),
        ("deep json label", "ALLOC name=" + '"' + "[" * 1000 + '"' + " bytes=1 category=weights\n", "either"),
        ("NUL", "\x00\n", "reject"),
        ("key huge", f"SEND peer=1 bytes=1 key={HUGE_INT}>1:F:0 handle=h\n", "reject"),
        ("gemm huge", f"F stage=0 mb=0 chunk=0 blocks=0:1 flops=1.0 hbm=1.0 gemm={HUGE_INT}x1x1\n", "reject"),
    ):
        cases.append(Case("torch-csv", f"op csv: {name}", [], expect, tool="api", api="simgrid.ir.torch_csv:from_csv",
                          files={"input.csv": body}))
    return cases


# -- plot inputs ------------------------------------------------------------------------------------
SWEEP_COLUMNS = ("dp", "tp", "pp", "vpp", "zero", "mbs", "schedule", "recompute", "cp", "sequence_parallel",
                 "flash_attention", "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes", "fits", "gpus")


def _sweep_csv() -> str:
    rows = []
    for i, (dp, tp, pp) in enumerate(((8, 1, 1), (4, 2, 1), (2, 2, 2), (2, 4, 1), (1, 8, 1), (4, 1, 2))):
        step = 1.0 + 0.1 * i
        rows.append([dp, tp, pp, 1, 0, 1, "1f1b" if pp > 1 else "none", "none", 1, False, False, step,
                     8 * 2048 / step, 0.4 - 0.01 * i, 2**34 + i, True, 8])
    return "\n".join([",".join(SWEEP_COLUMNS)] + [",".join(str(v) for v in row) for row in rows]) + "\n"


def plot_cases() -> list[Case]:
    """Sweep CSVs with text, NaN and huge values in numeric columns; traces with bad rows; bad metrics."""
    csv_text = _sweep_csv()
    header, *rows = csv_text.splitlines()
    cols = header.split(",")
    cases = []
    for kind in ("ranking", "heatmap"):
        cases.append(Case("plot", f"sweep {kind}: valid", ["plot", "s.csv", "--kind", kind, "--out", "o.png"],
                          "accept", files={"s.csv": csv_text}))
    for col_index, col in enumerate(cols):
        values = (("text", "fast", "reject"), ("NaN", "NaN", "reject"), ("empty", "", "reject"),
                  ("inf", "inf", "reject"), ("huge", HUGE_INT, "reject"), ("negative", "-5", "either"))
        for name, value, expect in rotate(values, ("text", "NaN"), col_index):
            broken = [r.split(",") for r in rows]
            broken[1][col_index] = value
            body = "\n".join([header] + [",".join(r) for r in broken]) + "\n"
            for kind in (("ranking", "heatmap")[col_index % 2],):
                cases.append(Case("plot", f"sweep {kind} {col}: {name}", ["plot", "s.csv", "--kind", kind, "--out",
                                  "o.png"], expect, files={"s.csv": body}))
        if col in ("step_time_s", "tp", "pp", "tokens_per_s", "mfu"):
            dropped = "\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != col_index)
                                for line in csv_text.splitlines()) + "\n"
            needs = {"ranking": ("dp", "tp", "pp", "step_time_s"), "heatmap": ("dp", "tp", "pp", "tokens_per_s")}
            for kind, needed in needs.items():
                cases.append(Case("plot", f"sweep {kind} without {col}", ["plot", "s.csv", "--kind", kind, "--out",
                                  "o.png"], "reject" if col in needed else "accept", files={"s.csv": dropped}))
    for metric, expect in (("schedule", "reject"), ("recompute", "reject"), ("nonexistent", "reject"), ("dp", "either"),
                           ("fits", "either"), ("step_time_s", "accept")):
        cases.append(Case("plot", f"heatmap --metric {metric}", ["plot", "s.csv", "--kind", "heatmap", "--metric",
                          metric, "--out", "o.png"], expect, files={"s.csv": csv_text}))
    for name, body in (("empty", b""), ("header only", header + "\n"), ("latin-1", csv_text.replace("none", "n\u00e9").encode("latin-1")),
                       ("utf-16", csv_text.encode("utf-16")), ("garbage", bytes(range(256)) * 4),
                       ("ragged rows", csv_text + "1,2\n"), ("a FIFO", None)):
        cases.append(Case("plot", f"sweep file: {name}", ["plot", "s.csv", "--out", "o.png"], "reject",
                          files={"s.csv": body}))
    cases.append(Case("plot", "sweep file: a directory", ["plot", "s.csv", "--out", "o.png"], "reject",
                      files={"s.csv/": b""}))
    cases.append(Case("plot", "heatmap --gpus 10^12", ["plot", "s.csv", "--kind", "heatmap", "--gpus", str(10**12),
                      "--out", "o.png"], "reject", files={"s.csv": csv_text}))
    cases += trace_cases()
    return cases


def _trace_files() -> tuple[dict[str, Any], dict[str, Any]]:
    from simgrid import Layout, simulate

    result = simulate("tiny-gpt", "dgx-a100-hdr", Layout(pp=2, global_batch_size=2))
    trace = result.trace
    saved = trace.to_json_dict()
    saved["rows"] = saved["rows"][:40]
    chrome = trace.to_chrome_trace()
    chrome["traceEvents"] = chrome["traceEvents"][:60]
    return json.loads(json.dumps(saved, default=str)), chrome


def trace_cases() -> list[Case]:
    """Saved traces (simgrid format and Chrome JSON) with bad rows, types and sizes, for gantt and memory."""
    saved, chrome = _trace_files()
    cases = []
    for kind in ("gantt", "memory"):
        cases.append(Case("plot-trace", f"saved trace {kind}: valid", ["plot", "t.json", "--kind", kind, "--out",
                          "o.png"], "accept", files={"t.json": json.dumps(saved)}))
    cases.append(Case("plot-trace", "chrome trace gantt: valid", ["plot", "t.json", "--out", "o.png"], "accept",
                      files={"t.json": json.dumps(chrome)}))
    columns = saved["columns"]
    first = saved["rows"][0]
    values = (("text", "x", "reject"), ("null", None, "either"), ("huge int", 10**40, "either"),
              ("nested", [[1]], "reject"), ("bool", True, "either"), ("negative", -1, "either"))
    for index, column in enumerate(columns):
        for name, value, expect in rotate(values, ("text",), index):
            if column in ("stream", "op", "kind", "purpose", "match") and name in ("text", "huge int", "negative", "bool"):
                expect = "either"
            mutated = copy.deepcopy(saved)
            row = list(first)
            row[index] = value
            mutated["rows"][0] = row
            cases.append(Case("plot-trace", f"saved trace row {column}: {name}", ["plot", "t.json", "--out", "o.png"],
                              expect, files={"t.json": json.dumps(mutated)}))
    for name, edit, expect in (
        ("rows not a list", lambda t: t.update({"rows": 5}), "reject"),
        ("row not a list", lambda t: t["rows"].__setitem__(0, 5), "reject"),
        ("columns text", lambda t: t.update({"columns": "rank"}), "reject"),
        ("columns unknown", lambda t: t.update({"columns": ["a", "b"]}), "reject"),
        ("no rows", lambda t: t.update({"rows": []}), "gantt-reject"),
        ("meta list", lambda t: t.update({"meta": [1]}), "reject"),
        ("memory timeline garbage", lambda t: t["meta"].update({"memory_timeline": {"0": "x"}}), "reject"),
        ("memory timeline huge", lambda t: t["meta"].update({"memory_timeline": {"0": {"times_s": [0, 1],
                                                             "total_bytes": [0, 10**40]}}}), "either"),
        ("multiplicity text", lambda t: t["meta"].update({"multiplicity": {"0": "many"}}), "reject"),
        ("start after end", lambda t: t["rows"][0].__setitem__(columns.index("start_s"), 1e9), "either"),
    ):
        mutated = copy.deepcopy(saved)
        edit(mutated)
        for kind in ("gantt", "memory"):
            exp = expect
            if kind == "gantt" and name.startswith("memory timeline"):
                exp = "either"
            if expect == "gantt-reject":
                exp = "reject" if kind == "gantt" else "either"
            cases.append(Case("plot-trace", f"saved trace {name} ({kind})", ["plot", "t.json", "--kind", kind, "--out",
                              "o.png"], exp, files={"t.json": json.dumps(mutated)}))
    event = next(e for e in chrome["traceEvents"] if e.get("ph") == "X")
    values = (("text", "x", "reject"), ("huge", 10**40, "either"), ("NaN", "NaN", "reject"),
              ("null", None, "either"), ("list", [1], "reject"))
    for index, key in enumerate(("pid", "ts", "dur", "name", "args", "tid")):
        for name, value, expect in rotate(values, ("text",), index):
            if (key in ("name", "tid") and name != "list") or (key == "args" and name in ("null",)):
                expect = "either"
            mutated = copy.deepcopy(chrome)
            events = mutated["traceEvents"]
            position = events.index(next(e for e in events if e.get("ph") == "X"))
            events[position] = {**event, key: value}
            text = json.dumps(mutated).replace('"NaN"', "NaN")
            cases.append(Case("plot-trace", f"chrome event {key}: {name}", ["plot", "t.json", "--out", "o.png"], expect,
                              files={"t.json": text}))
    for name, body in (("huge integers", '{"traceEvents": [{"ph": "X", "pid": ' + HUGE_INT + ', "ts": 0, "dur": 1}]}'),
                       ("deep nesting", "[" * 100000 + "]" * 100000), ("latin-1", b'{"format": "\xe9"}'),
                       ("utf-16", json.dumps(saved).encode("utf-16")), ("empty", b""), ("a FIFO", None),
                       ("traceEvents not a list", '{"traceEvents": 5}'), ("a list", "[]")):
        cases.append(Case("plot-trace", f"trace file: {name}", ["plot", "t.json", "--out", "o.png"], "reject",
                          files={"t.json": body}))
    cases.append(Case("plot-trace", "trace file: a directory", ["plot", "t.json", "--out", "o.png"], "reject",
                      files={"t.json/": b""}))
    cases.append(Case("plot-trace", "--ranks garbage", ["plot", "t.json", "--ranks", "a,b", "--out", "o.png"],
                      "reject", files={"t.json": json.dumps(saved)}))
    cases.append(Case("plot-trace", "--ranks huge", ["plot", "t.json", "--ranks", HUGE_INT, "--out", "o.png"],
                      "reject", files={"t.json": json.dumps(saved)}))
    cases.append(Case("plot-trace", "--ranks absent", ["plot", "t.json", "--ranks", "99", "--out", "o.png"],
                      "reject", files={"t.json": json.dumps(saved)}))
    return cases


# -- output paths -----------------------------------------------------------------------------------
def output_cases() -> list[Case]:
    """Every writing command into a missing directory, a file's child, a directory, a FIFO, a full disk."""
    saved, _ = _trace_files()
    sim = ["simulate", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2"]
    writers: dict[str, tuple[list[str], str, dict[str, Any]]] = {
        "simulate --trace": ([*sim, "--trace"], "t.json", {}),
        "simulate --gantt": ([*sim, "--gantt"], "g.png", {}),
        "program --out": (["program", "--model", "tiny-gpt", "--pp", "2", "--gbs", "2", "--out"], "p.json", {}),
        "sweep --out": (["sweep", "--model", "tiny-gpt", "--cluster", "dgx-a100-hdr", "--gpus", "2", "--gbs", "4",
                         "--zero", "0", "--recompute", "none", "--mbs", "1", "--workers", "1", "--no-progress",
                         "--out"], "s.csv", {}),
        "plot --out": (["plot", "t.json", "--out"], "o.png", {"t.json": json.dumps(saved)}),
        "schedule --out": (["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out"], "s.txt", {}),
        "demo --out": (["demo", "--out"], "out", {}),
    }
    cases = []
    for label, (argv, target, files) in writers.items():
        is_dir = label == "demo --out"
        cases.append(Case("output", f"{label}: valid", [*argv, target], "accept", files=dict(files)))
        bad: list[tuple[str, str, dict[str, Any], str, int | None]] = [
            ("missing directory", f"missing/{target}", {}, "reject", None),
            ("parent is a file", f"afile/{target}", {"afile": "x"}, "reject", None),
            ("full disk", target, {}, "reject", 64),
            ("name too long", "x" * 300 + target, {}, "reject", None),
        ]
        if not is_dir:
            bad += [("target is a directory", target, {f"{target}/": b""}, "reject", None),
                    ("target is a FIFO", target, {target: None}, "reject", None),
                    ("target in /proc", f"/proc/{target}", {}, "reject", None),
                    ("empty path", "", {}, "reject", None)]
        for name, path, extra, expect, fsize in bad:
            cases.append(Case("output", f"{label}: {name}", [*argv, path], expect, files={**files, **extra}, fsize=fsize))
    # Two outputs, one of them bad: nothing may be written.
    cases.append(Case("output", "simulate --trace ok --gantt missing/", [*sim, "--trace", "t.json", "--gantt", "missing/g.png"], "reject"))
    cases.append(Case("output", "simulate --gantt ok --trace missing/", [*sim, "--gantt", "g.png", "--trace", "missing/t.json"], "reject"))
    cases.append(Case("output", "simulate --gantt bad suffix", [*sim, "--trace", "t.json", "--gantt", "g.txt"], "reject"))
    cases.append(Case("output", "simulate --trace ok --gantt full disk", [*sim, "--trace", "t.json", "--gantt", "g.png"],
                      "reject", fsize=64))
    cases.append(Case("output", "plot --out bad suffix", ["plot", "t.json", "--out", "o.jpg2"], "reject",
                      files={"t.json": json.dumps(saved)}))
    return cases


# -- executor ---------------------------------------------------------------------------------------
def executor_cases() -> list[Case]:
    """``simgrid-exec run``: bad program files and flags that must be refused before any rank is spawned."""
    program = _program_json()
    text = json.dumps(program)
    send = next(line for line in program["ranks"][0] if line.startswith("SEND"))
    recv = next(line for line in program["ranks"][1] if line.startswith("RECV"))
    size = send.split("bytes=")[1].split()[0]
    huge_bytes = json.dumps({**program, "ranks": [[ln.replace(f"bytes={size}", f"bytes={10**40}") if ln in (send,)
                                                   else ln for ln in r] for r in program["ranks"]]})
    huge_bytes = huge_bytes.replace(recv, recv.replace(f"bytes={size}", f"bytes={10**40}"))
    run = ["run", "--program", "p.json", "--timeout", "60"]
    cases = []
    for name, body in (
        ("5000-digit integer", text.replace('"version": 1', f'"version": {HUGE_INT}')),
        ("deep nesting", "[" * 100000 + "]" * 100000),
        ("SEND/RECV bytes 10^40", huge_bytes),
        ("garbage", bytes(range(256))),
        ("a directory", b""),
    ):
        files = {"p.json/": b""} if name == "a directory" else {"p.json": body}
        cases.append(Case("executor", f"run --program {name}", run, "reject", tool="simgrid-exec", files=files))
    for name, args, expect in (
        ("--timeout 0", ["--timeout", "0"], "reject"),
        ("--timeout -1", ["--timeout", "-1"], "reject"),
        ("--timeout nan", ["--timeout", "nan"], "reject"),
        ("--timeout inf", ["--timeout", "inf"], "reject"),
        ("--timeout abc", ["--timeout", "abc"], "reject"),
        ("--optimizer adam-8bit", ["--optimizer", "adam-8bit"], "reject"),
        ("--steps 0", ["--steps", "0"], "reject"),
        ("--gbs 10^12", ["--gbs", str(10**12)], "reject"),
        ("--dp 10^6", ["--dp", str(10**6)], "reject"),
        ("--trace missing dir", ["--trace", "missing/t.json"], "reject"),
        ("--model a directory", ["--model", "d.json"], "reject"),
    ):
        files = {"d.json/": b""} if "directory" in name else {}
        cases.append(Case("executor", f"run {name}", ["run", *args], expect, tool="simgrid-exec", files=files))
    for name, args in (("calibrate --out through a file", ["calibrate", "--out", "g.toml/p.toml"]),
                       ("calibrate --out a directory", ["calibrate", "--out", "d"]),
                       ("validate --profile a directory", ["validate", "--profile", "d"]),
                       ("validate --profile garbage", ["validate", "--profile", "g.toml"])):
        files = {"d/": b"", "g.toml": bytes(range(256))}
        cases.append(Case("executor", name, args, "reject", tool="simgrid-exec", files=files))
    return cases


# -- serving ----------------------------------------------------------------------------------------
def serve_cases() -> list[Case]:
    """``simgrid serve``: workload flags at the extremes, request traces that are not CSV, output paths."""
    base = ["serve", "--model", "llama2-7b", "--cluster", "dgx-a100-hdr", "--tp", "2"]
    trace = "arrival_s,prompt_tokens,output_tokens\n0.0,128,32\n0.5,256,16\n"
    cases = [Case("serve", "valid", [*base, "--rate", "4", "--requests", "50"], "accept"),
             Case("serve", "valid trace", [*base, "--trace", "t.csv"], "accept", files={"t.csv": trace})]
    for name, args, expect in (
        ("--requests 10^9", ["--rate", "4", "--requests", str(10**9)], "reject"),
        ("--rate 1e300", ["--rate", "1e300", "--requests", "50"], "either"),
        ("--rate nan", ["--rate", "nan"], "reject"),
        ("--rate text", ["--rate", "fast"], "reject"),
        ("--rate 5000 digits", ["--rate", HUGE_INT], "either"),
        ("--prompt-tokens 10^9", ["--rate", "4", "--prompt-tokens", str(10**9)], "reject"),
        ("--prompt-tokens reversed range", ["--rate", "4", "--prompt-tokens", "512-128"], "reject"),
        ("--max-batch 10^9", ["--rate", "4", "--requests", "50", "--max-batch", str(10**9)], "either"),
        ("--memory-utilization 2", ["--rate", "4", "--memory-utilization", "2"], "reject"),
        ("--gpus without targets", ["--rate", "4", "--gpus", "8"], "reject"),
    ):
        cases.append(Case("serve", name, [*base, *args], expect))
    for name, body, expect in (
        ("a FIFO", None, "reject"), ("latin-1", "arrival_s,prompt_tokens,output_tokens\n0,\xe9,1\n".encode("latin-1"),
                                     "reject"),
        ("utf-16", trace.encode("utf-16"), "reject"), ("empty", "", "reject"), ("garbage", bytes(range(256)), "reject"),
        ("nan arrival", "arrival_s,prompt_tokens,output_tokens\nnan,1,1\n", "reject"),
        ("huge tokens", f"arrival_s,prompt_tokens,output_tokens\n0,{HUGE_INT},1\n", "reject"),
        ("missing column", "arrival_s,prompt_tokens\n0,1\n", "reject"),
    ):
        cases.append(Case("serve", f"--trace {name}", [*base, "--trace", "t.csv"], expect, files={"t.csv": body}))
    cases.append(Case("serve", "--trace a directory", [*base, "--trace", "t.csv"], "reject", files={"t.csv/": b""}))
    for flag, target in (("--latency-plot", "l.png"), ("--kv-plot", "k.png"), ("--records", "r.csv")):
        run = [*base, "--rate", "4,8", "--requests", "50"]
        cases.append(Case("serve", f"{flag} valid", [*run, flag, target], "accept"))
        cases.append(Case("serve", f"{flag} missing directory", [*run, flag, f"missing/{target}"], "reject"))
        cases.append(Case("serve", f"{flag} full disk", [*run, flag, target], "reject", fsize=64))
    cases.append(Case("serve", "--latency-plot bad suffix", [*base, "--rate", "4", "--latency-plot", "l.txt"],
                      "reject"))
    return cases

