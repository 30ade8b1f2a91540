"""Profile loader: search path and drop-in folders, references and inline tables, and error messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simgrid.errors import ProfileError
from simgrid.hardware import (
    ProfileWarning,
    list_profiles,
    load_cluster,
    load_cluster_spec,
    load_gpu,
    load_node,
    profile_search_path,
    write_profile,
)

BUILTIN = Path(__file__).resolve().parents[2] / "hardware_profiles"

GPU_TOML = """
kind = "gpu"
name = "toy-gpu"
description = "a toy"
memory_GiB = 16
hbm_bandwidth_GBps = 1000
hbm_efficiency = 0.9
kernel_overhead_us = 5
comm_compute_slowdown = 0.1

[peak_tflops]
bf16 = 100
fp32 = 10

[matmul]
max_efficiency = 0.8
"""

NODE_TOML = """
kind = "node"
name = "toy-node"
description = "two toys"
gpu = "toy-gpu"
gpus_per_node = 2
intra_fabric = "pcie"
gpus_per_pcie_switch = 2
host_memory_GiB = 64
host_adam_params_per_s = 1e9
nics_per_node = 1
nic_bandwidth_Gbps = 25
nic_latency_us = 20
nic_efficiency = 0.9

[intra_link]
bandwidth_GBps = 16
latency_us = 5.7
efficiency = 0.8

[pcie_link]
bandwidth_GBps = 16
latency_us = 5.7
efficiency = 0.8
"""

NETWORK_TOML = """
[network]
kind = "ethernet"
topology = "single-switch"
oversubscription = 1.0
switch_latency_us = 2.0
efficiency = 1.0
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def drop_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user folder on SIMGRID_PROFILE_PATH."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", str(folder))
    return folder


def test_search_path_order_is_env_then_user_config_then_builtin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_search_path: Path
) -> None:
    """$SIMGRID_PROFILE_PATH entries (os.pathsep separated) come first, the built-in folder last."""
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert profile_search_path() == [
        tmp_path / "a", tmp_path / "b", isolated_search_path / ".config" / "simgrid" / "profiles", BUILTIN,
    ]


def test_drop_in_profiles_load_by_name_from_subfolder_or_top_level(drop_in: Path) -> None:
    """A GPU in gpus/ and a node directly in the folder (its `kind` decides) both load by name."""
    _write(drop_in / "gpus" / "toy-gpu.toml", GPU_TOML)
    _write(drop_in / "toy-node.toml", NODE_TOML)
    node = load_node("toy-node")
    assert node.gpu.name == "toy-gpu" and node.nic_link.bandwidth_GBps == 25 / 8
    assert node.gpu.matmul.efficiency(8, 8, 8) == 0.8  # flat curve when min_dim/relative are omitted
    listed = {(i.kind, i.name): i for i in list_profiles()}
    assert listed[("node", "toy-node")].path == drop_in / "toy-node.toml"
    assert ("cluster", "dgx-a100-hdr") in listed  # built-ins still listed


def test_user_config_folder_is_searched(isolated_search_path: Path) -> None:
    """~/.config/simgrid/profiles works without any environment variable."""
    _write(isolated_search_path / ".config" / "simgrid" / "profiles" / "gpus" / "toy-gpu.toml", GPU_TOML)
    assert load_gpu("toy-gpu").peak_flops("bf16") == 100e12


def test_drop_in_shadows_builtin_of_same_name(drop_in: Path) -> None:
    """Earlier folders win, so a user can override a shipped profile."""
    _write(drop_in / "gpus" / "a100-80gb-sxm.toml", GPU_TOML.replace('"toy-gpu"', '"a100-80gb-sxm"'))
    assert load_gpu("a100-80gb-sxm").memory_GiB == 16
    assert load_node("dgx-a100").gpu.memory_GiB == 16  # references resolve through the same path


def test_load_by_path_with_relative_reference(tmp_path: Path) -> None:
    """Loading by path needs no search path; a path-like reference is relative to the referring file."""
    _write(tmp_path / "parts" / "g.toml", GPU_TOML)
    node_file = _write(tmp_path / "n.toml", NODE_TOML.replace('gpu = "toy-gpu"', 'gpu = "parts/g.toml"'))
    cluster_file = _write(tmp_path / "c.toml", 'kind = "cluster"\nname = "c"\ndescription = ""\nnode = "n.toml"\n'
                          + NETWORK_TOML)
    assert load_node(node_file).gpu.name == "toy-gpu"
    assert load_node(str(node_file)).gpus_per_node == 2
    cluster = load_cluster(cluster_file, gpus=3)
    assert (cluster.num_nodes, cluster.gpus_per_node) == (2, 2)


def test_cluster_with_inline_node_and_inline_gpu(tmp_path: Path) -> None:
    """[node] and [node.gpu] inline tables make one self-contained file (what calibration writes)."""
    node_body = NODE_TOML.replace('kind = "node"\n', "").replace('gpu = "toy-gpu"\n', "")
    node_body = node_body.replace("[intra_link]", "[node.intra_link]").replace("[pcie_link]", "[node.pcie_link]")
    gpu_body = GPU_TOML.replace('kind = "gpu"\n', "").replace("[peak_tflops]", "[node.gpu.peak_tflops]")
    gpu_body = gpu_body.replace("[matmul]", "[node.gpu.matmul]")
    text = ('kind = "cluster"\nname = "solo"\ndescription = "self-contained"\n' + NETWORK_TOML
            + "\n[node]" + node_body.split("[node.intra_link]")[0]
            + "[node.intra_link]" + node_body.split("[node.intra_link]")[1]
            + "\n[node.gpu]" + gpu_body)
    spec = load_cluster_spec(_write(tmp_path / "solo.toml", text))
    assert spec.node.name == "toy-node" and spec.node.gpu.peak_tflops["fp32"] == 10


def test_inline_node_referencing_gpu_by_name(tmp_path: Path) -> None:
    """An inline [node] may still name a shipped GPU."""
    node_body = NODE_TOML.replace('kind = "node"\n', "").replace("toy-gpu", "h100-sxm")
    node_body = node_body.replace("[intra_link]", "[node.intra_link]").replace("[pcie_link]", "[node.pcie_link]")
    text = 'kind = "cluster"\nname = "x"\ndescription = ""\n' + NETWORK_TOML + "\n[node]" + node_body
    assert load_cluster_spec(_write(tmp_path / "x.toml", text)).node.gpu.peak_tflops["bf16"] == 989.4


def test_written_profile_in_drop_in_folder_loads_by_name(drop_in: Path) -> None:
    """write_profile output dropped into a profile folder is found by its file name."""
    spec = dataclasses.replace(load_cluster_spec("dgx-a100-hdr"), name="my-cluster", max_nodes=4)
    write_profile(spec, drop_in / "clusters" / "my-cluster.toml")
    assert load_cluster_spec("my-cluster") == spec
    with pytest.raises(ProfileError, match="at most 4 nodes"):
        load_cluster("my-cluster", gpus=33)


# ---- bad input: each error names the file, the field path, the value and the rule ----------------------

def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    """tomllib's line/column is kept."""
    bad = _write(tmp_path / "bad.toml", 'kind = "gpu"\nname = \n')
    with pytest.raises(ProfileError, match=r"bad\.toml: malformed TOML: .*line 2"):
        load_gpu(bad)


def test_unknown_key_lists_known_keys(tmp_path: Path) -> None:
    """An extra key is rejected, with the keys that would have been accepted."""
    bad = _write(tmp_path / "extra.toml", GPU_TOML.replace("memory_GiB = 16", "memory_GiB = 16\nl2_cache_MiB = 40"))
    with pytest.raises(ProfileError, match=r"extra\.toml: l2_cache_MiB is not a known key; "
                                           r"known keys here: kind, name, description, memory_GiB, hbm_bandwidth_GBps"):
        load_gpu(bad)


def test_misspelt_required_key_is_pointed_out(tmp_path: Path) -> None:
    """A typo of a required key says it is missing and names the near miss."""
    bad = _write(tmp_path / "typo.toml", GPU_TOML.replace("hbm_bandwidth_GBps", "hbm_bandwith_GBps"))
    with pytest.raises(ProfileError, match=r"typo\.toml: hbm_bandwidth_GBps is missing \(required field\); "
                                           r"found hbm_bandwith_GBps instead, a typo\?"):
        load_gpu(bad)


def test_unknown_dtype_in_peak_table_is_rejected(tmp_path: Path) -> None:
    """peak_tflops only accepts the known dtypes."""
    bad = _write(tmp_path / "d.toml", GPU_TOML.replace("fp32 = 10", "int4 = 10"))
    with pytest.raises(ProfileError, match=r"peak_tflops\.int4 is not a known key; known keys here: fp32, tf32"):
        load_gpu(bad)


def test_negative_bandwidth_names_field_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The message has the exact shape users see."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "gpus" / "toy-gpu.toml", GPU_TOML)
    monkeypatch.setenv("SIMGRID_PROFILE_PATH", str(tmp_path))
    text = NODE_TOML.replace("[intra_link]\nbandwidth_GBps = 16", "[intra_link]\nbandwidth_GBps = -3.0")
    _write(tmp_path / "nodes" / "x.toml", text)
    with pytest.raises(ProfileError) as info:
        load_node("x")
    assert str(info.value) == "nodes/x.toml: intra_link.bandwidth_GBps = -3.0 must be > 0"


def test_inline_error_path_includes_enclosing_tables(tmp_path: Path) -> None:
    """In a cluster file an inline node's link error reads node.intra_link.bandwidth_GBps."""
    node_body = NODE_TOML.replace('kind = "node"\n', "").replace("toy-gpu", "h100-sxm")
    node_body = node_body.replace("[intra_link]\nbandwidth_GBps = 16", "[node.intra_link]\nbandwidth_GBps = -3.0")
    node_body = node_body.replace("[pcie_link]", "[node.pcie_link]")
    bad = _write(tmp_path / "c.toml", 'kind = "cluster"\nname = "c"\ndescription = ""\n' + NETWORK_TOML
                 + "\n[node]" + node_body)
    with pytest.raises(ProfileError, match=r"c\.toml: node\.intra_link\.bandwidth_GBps = -3\.0 must be > 0"):
        load_cluster_spec(bad)


def test_nic_rate_errors_use_the_toml_key_and_value(tmp_path: Path) -> None:
    """The Gb/s key is what the user wrote, so the error names it (not the GB/s field)."""
    _write(tmp_path / "g.toml", GPU_TOML)
    bad = _write(tmp_path / "n.toml", NODE_TOML.replace('"toy-gpu"', '"g.toml"').replace(
        "nic_bandwidth_Gbps = 25", "nic_bandwidth_Gbps = -200"))
    with pytest.raises(ProfileError, match=r"n\.toml: nic_bandwidth_Gbps = -200 must be > 0"):
        load_node(bad)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("memory_GiB = 16\n", "", r"memory_GiB is missing \(required field\)"),
        ("hbm_efficiency = 0.9", "hbm_efficiency = 1.5", r"hbm_efficiency = 1\.5 must be in \(0, 1\]"),
        ("hbm_efficiency = 0.9", 'hbm_efficiency = "high"', r"hbm_efficiency = 'high' must be a number"),
        ("memory_GiB = 16", "memory_GiB = inf", r"memory_GiB = inf must be finite"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 1.0", r"comm_compute_slowdown = 1\.0 must be in \[0, 1\)"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\np2p_compute_slowdown = 1.5",
         r"p2p_compute_slowdown = 1\.5 must be in \[0, 1\)"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\ncopy_engine_compute_slowdown = -0.1",
         r"copy_engine_compute_slowdown = -0\.1 must be in \[0, 1\)"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\nmin_dim = [256, 512]\nrelative = [0.5]",
         r"matmul\.relative = \[0\.5\] must have 2 values"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\nmin_dim = [256.0]\nrelative = [0.5]",
         r"matmul\.min_dim\[0\] = 256\.0 must be an integer"),
        ("fp32 = 10", "fp32 = -10", r"peak_tflops\.fp32 = -10\.0 must be > 0"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\nfused_attention_efficiency = 1.5",
         r"fused_attention_efficiency = 1\.5 must be in \(0, 1\]"),
        ("max_efficiency = 0.8", 'max_efficiency = 0.8\n[sources]\nmemory = "x"',
         r"sources\.memory = 'x' names no field of this profile"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\ntile_m = 128", r"matmul\.tile_n = 0 must be given together"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\nmax_efficiency_fp8 = 1.5",
         r"matmul\.max_efficiency_fp8 = 1\.5 must be in \(0, 1\]"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\nsm_count = 13.5", r"sm_count = 13\.5 must be an integer"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\nsustained_clock_fraction = 0",
         r"sustained_clock_fraction = 0\.0 must be in \(0, 1\]"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\nchip_speed_spread = -0.1",
         r"chip_speed_spread = -0\.1 must be in \[0, 1\): the \(max - min\) / mean spread .* e\.g\. 0\.045"),
        ("comm_compute_slowdown = 0.1", "comm_compute_slowdown = 0.1\nchip_speed_spread = 1.5",
         r"chip_speed_spread = 1\.5 must be in \[0, 1\).*0 for identical chips"),
        ("comm_compute_slowdown = 0.1", 'comm_compute_slowdown = 0.1\nchip_speed_spread = "5%"',
         r"chip_speed_spread = '5%' must be a number"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\n[fused_attention]\ndefault = \"fa3\"",
         r"fused_attention\.default = 'fa3' must name a fused_attention table"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\n[fused_attention.fa9]\nseq_len = [512]",
         r"fused_attention\.fa9 = .* is not a known kernel; use one of fa2, fa3"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\n[fused_attention.fa2]\nseq_len = [512, 1024]\nhead_dim = [128]\n"
         "fwd_causal_tflops = [[1, 2]]\nfwd_tflops = [[1, 2]]\nbwd_tflops = [[1]]",
         r"fused_attention\.fa2\.bwd_tflops\[0\] = \[1\.0\] must have 2 values, one per seq_len"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\n[fused_attention.fa2]\nseq_len = [512]\nhead_dim = [128]\n"
         "fwd_causal_tflops = [1]\nfwd_tflops = [[1]]\nbwd_tflops = [[1]]",
         r"fused_attention\.fa2\.fwd_causal_tflops = \[1\] must be an array of arrays of numbers"),
        ("max_efficiency = 0.8", "max_efficiency = 0.8\n[fused_attention.fa2]\nseq_len = [512, 1024]\nhead_dim = [128]\n"
         "fwd_causal_tflops = [[1, 2]]\nfwd_tflops = [[1, 2]]\nbwd_tflops = [[1, 2]]\nbwd_causal_tflops = [[1, 0]]",
         r"fused_attention\.fa2\.bwd_causal_tflops\[0\]\[1\] = 0\.0 must be > 0"),
    ],
)
def test_gpu_field_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Missing fields, ranges, types and curve shape each give a message naming the field and the rule."""
    assert old in GPU_TOML
    bad = _write(tmp_path / "g.toml", GPU_TOML.replace(old, new))
    with pytest.raises(ProfileError, match=r"g\.toml: " + message):
        load_gpu(bad)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('intra_fabric = "pcie"', 'intra_fabric = "infinity-fabric"',
         r"intra_fabric = 'infinity-fabric' must be one of 'nvswitch', 'nvlink-mesh', 'pcie'"),
        ("gpus_per_node = 2", "gpus_per_node = 2.0", r"gpus_per_node = 2\.0 must be an integer"),
        ("gpus_per_pcie_switch = 2", "gpus_per_pcie_switch = 4", r"gpus_per_pcie_switch = 4 must be <= gpus_per_node"),
        ("nics_per_node = 1", "nics_per_node = 0", r"nics_per_node = 0 must be an integer >= 1"),
        ("latency_us = 5.7\nefficiency = 0.8\n\n[pcie_link]", "latency_us = -1\nefficiency = 0.8\n\n[pcie_link]",
         r"intra_link\.latency_us = -1\.0 must be >= 0 and finite"),
        ('gpu = "toy-gpu"', "gpu = 3", r"gpu = 3 must be a GPU profile name, a path, or an inline \[gpu\] table"),
        ("nics_per_node = 1", 'nics_per_node = 1\ncpu_vendor = "via"',
         r"cpu_vendor = 'via' must be one of 'intel', 'amd', 'arm'"),
        ("nics_per_node = 1", 'nics_per_node = 1\ngpu_arch = "kepler"',
         r"gpu_arch = 'kepler' must be one of 'volta', 'ampere', 'hopper', 'blackwell'"),
        ("nics_per_node = 1", "nics_per_node = 1\nnvlink_sharp = 1", r"nvlink_sharp = 1 must be true or false"),
        ("nics_per_node = 1", "nics_per_node = 1\nnvlink_sharp = true",
         r"nvlink_sharp = True needs intra_fabric = 'nvswitch' \(got 'pcie'\)"),
    ],
)
def test_node_field_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    """Enum, integer, cross-field and nested-link rules on nodes."""
    assert old in NODE_TOML
    _write(tmp_path / "toy-gpu.toml", GPU_TOML)
    bad = _write(tmp_path / "n.toml", NODE_TOML.replace('"toy-gpu"', '"toy-gpu.toml"').replace(
        old.replace('"toy-gpu"', '"toy-gpu.toml"'), new))
    with pytest.raises(ProfileError, match=r"n\.toml: " + message):
        load_node(bad)


def test_unknown_gpu_reference_lists_available_gpus(tmp_path: Path) -> None:
    """The referring file and field are named, with the GPUs that do exist and where they were looked for."""
    bad = _write(tmp_path / "n.toml", NODE_TOML.replace("toy-gpu", "no-such-gpu"))
    with pytest.raises(ProfileError, match=r"n\.toml: gpu = 'no-such-gpu': no gpu profile named 'no-such-gpu'; "
                                           r"available gpus: a100-40gb-sxm, a100-80gb-sxm, .*; search path: "):
        load_node(bad)


def test_missing_reference_file_is_reported(tmp_path: Path) -> None:
    """A path-like reference to a missing file names both files."""
    bad = _write(tmp_path / "n.toml", NODE_TOML.replace('"toy-gpu"', '"nowhere.toml"'))
    with pytest.raises(ProfileError, match=r"n\.toml: gpu = 'nowhere\.toml': profile file .*nowhere\.toml does not exist"):
        load_node(bad)


def test_wrong_kind_by_name_and_by_path() -> None:
    """Asking load_gpu for a node says what it is and which loader to use."""
    with pytest.raises(ProfileError, match=r"'dgx-a100' is a node profile \(.*dgx-a100\.toml\), not a gpu profile"):
        load_gpu("dgx-a100")
    with pytest.raises(ProfileError, match=r"dgx-a100\.toml: kind = 'node' but a gpu profile was expected; "
                                           r"load it with load_node"):
        load_gpu(BUILTIN / "nodes" / "dgx-a100.toml")


def test_unknown_name_lists_available_names_and_search_path() -> None:
    """A typo in a cluster name shows the clusters there are and where they were searched."""
    with pytest.raises(ProfileError, match=r"no cluster profile named 'dgx-a100-hbr'; available clusters: "
                                           r"dgx-a100-40gb-hdr, dgx-a100-hdr, .*; search path: .*hardware_profiles"):
        load_cluster_spec("dgx-a100-hbr")


def test_bad_network_kind_in_cluster(tmp_path: Path) -> None:
    """network.kind must be a known fabric."""
    text = 'kind = "cluster"\nname = "c"\ndescription = ""\nnode = "dgx-a100"\n' + NETWORK_TOML.replace(
        '"ethernet"', '"token-ring"')
    with pytest.raises(ProfileError, match=r"c\.toml: network\.kind = 'token-ring' must be one of"):
        load_cluster_spec(_write(tmp_path / "c.toml", text))


def test_malformed_drop_in_file_is_reported_by_list_profiles(drop_in: Path) -> None:
    """A broken user file is skipped with a warning naming it (not silently), and the others are listed."""
    _write(drop_in / "broken.toml", "kind = [\n")
    with pytest.warns(ProfileWarning, match=r"broken\.toml: malformed TOML"):
        names = [info.name for info in list_profiles()]
    assert "broken" not in names and "dgx-a100-hdr" in names


def test_wheel_install_finds_profiles_under_prefix_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a repo checkout next to the package, the data-files folder under sys.prefix is used."""
    import sys

    from simgrid.hardware import search

    site = tmp_path / "lib" / "site-packages" / "simgrid" / "hardware"
    site.mkdir(parents=True)
    share = tmp_path / "prefix" / "share" / "llm-simgrid" / "hardware_profiles"
    _write(share / "gpus" / "toy-gpu.toml", GPU_TOML)
    monkeypatch.setattr(search, "__file__", str(site / "search.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    assert search.builtin_profile_dir() == share
    assert load_gpu("toy-gpu").name == "toy-gpu"
