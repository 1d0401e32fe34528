"""The HLO parser and the three HLO detectors, on real modules saved under data/hlo/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldiag.analysis.collection.hlo import text as hlo
from mldiag.analysis.collection.hlo.detectors import (
    MIN_BYTES,
    Detection,
    detect_layout_mismatch_copies,
    detect_unfused_reshapes,
    detect_unnecessary_convert_reduce,
)
from mldiag.analysis.collection.hlo.facts import custom_calls

DATA = Path(__file__).parent / "data" / "hlo"
DETECTORS = (
    detect_layout_mismatch_copies,
    detect_unfused_reshapes,
    detect_unnecessary_convert_reduce,
)


def _text(name: str) -> str:
    return (DATA / f"{name}.hlo").read_text()


def _modules(*names: str) -> dict[str, str]:
    return {name: _text(name) for name in names}


def _all(modules: dict[str, str]) -> dict[str, list[Detection]]:
    return {d.__name__: d(modules) for d in DETECTORS}


# ---------------------------------------------------------------- parser


def test_parses_profile_text_into_fusions_and_their_bodies():
    module = hlo.parse_module(_text("cpu_layout_copy_step"))
    assert module.name == "jit_step"
    entry = module.entry
    assert entry is not None and entry.kind == hlo.ENTRY and entry.name == "main.1"
    copy = entry.get("wrapped_copy")
    assert copy is not None
    assert (copy.opcode, copy.kind, copy.calls, copy.operands) == (
        "fusion", "kLoop", "wrapped_copy_computation", ("x.1",))
    assert copy.shape.text == "f32[2048,2048]{1,0}"
    assert (copy.shape.dtype, copy.shape.dims, copy.shape.layout) == ("f32", (2048, 2048), (1, 0))
    assert copy.shape.byte_size == 2048 * 2048 * 4
    body = module.fusion_body(copy)
    assert body is not None and body.kind == hlo.FUSION
    assert body.root is not None and body.root.opcode == "copy"
    param = body.parameter(0)
    assert param is not None
    # A fusion parameter stands for the fusion's operand: the column-major input x.1.
    found = module.fusion_operand(body, param)
    assert found is not None
    caller_comp, operand = found
    assert caller_comp is entry and operand.name == "x.1"
    assert operand.shape.layout_text == param.shape.layout_text == "{0,1}"
    dot = entry.get("ynn_fusion")
    assert dot is not None and dot.kind == "kCustom"


def test_parses_long_form_with_metadata_and_stack_frames():
    module = hlo.parse_module(_text("cpu_transpose_copy_fusion"))
    body = module.computations["fused_computation"]
    transpose = body.get("transpose.0")
    assert transpose is not None
    assert transpose.dimensions == (1, 0)
    assert transpose.shape.layout == (0, 1)
    assert transpose.operands == ("param_0.1",)
    meta = transpose.metadata
    assert meta.op_name == "jit(transpose_only)/transpose"
    assert meta.source_file.endswith("hlo_cases.py") and meta.source_line == 10


def test_computation_kinds_entry_fusion_region_and_while_body():
    module = hlo.parse_module(_text("cpu_scan_convert_reduce"))
    kinds = {c.name: c.kind for c in module.computations.values()}
    assert kinds["main.7"] == hlo.ENTRY
    assert kinds["region_0.5"] == hlo.CONTROL  # while body
    assert kinds["region_3.6"] == hlo.CONTROL  # while condition
    assert kinds["region_2.3"] == hlo.REGION  # reduce to_apply
    assert kinds["fused_computation.3"] == hlo.FUSION
    executed = {c.name for c in module.executed_computations()}
    assert executed == {"main.7", "region_0.5", "region_3.6"}
    assert module.entry is not None
    while_op = module.entry.get("while.6")
    assert while_op is not None and while_op.shape.is_tuple
    assert [e.text for e in while_op.shape.elements] == [
        "s32[]", "f32[]", "f32[16,256]{1,0}", "bf16[16,256,256]{2,1,0}"]


def test_tpu_tiled_layouts_memory_spaces_and_tuple_shapes():
    module = hlo.parse_module(_text("tpu_inference_2_jit_f"))
    entry = module.entry
    assert entry is not None and entry.name == "main.22_spmd"
    param = entry.get("param")
    assert param is not None
    assert param.shape.layout == (3, 2, 1, 0)
    assert param.shape.tiling == "T(8,128)"
    assert param.shape.memory_space == 5
    assert param.shape.layout_text == "{3,2,1,0:T(8,128)}"
    start = entry.get("copy-start")
    assert start is not None and start.opcode == "copy-start" and start.shape.is_tuple
    assert len(start.shape.elements) == 3
    assert start.shape.elements[2].memory_space == 2
    assert start.shape.byte_size == 2 * 5 * 1024 * 1024 * 256 * 4 + 4


@pytest.mark.parametrize(
    ("text", "dtype", "dims", "layout"),
    [
        ("f32[]", "f32", (), None),
        ("pred[2,3]{1,0}", "pred", (2, 3), (1, 0)),
        ("s32[<=10]{0}", "s32", (10,), (0,)),
        ("bf16[4,8]{0,1}", "bf16", (4, 8), (0, 1)),
        ("f32[]{:T(128)}", "f32", (), ()),
        ("token[]", "token", (), None),
        ("f32[?]", "unknown", (), None),
        ("not a shape", "unknown", (), None),
    ],
)
def test_parse_shape_forms(text, dtype, dims, layout):
    shape = hlo.parse_shape(text)
    assert (shape.dtype, shape.dims, shape.layout) == (dtype, dims, layout)


def test_nested_tuple_shape_and_sub_byte_sizes():
    shape = hlo.parse_shape("(f32[2]{0}, (s32[], s4[3]{0}), /*index=2*/u8[4]{0})")
    assert shape.is_tuple and len(shape.elements) == 3
    assert shape.elements[1].is_tuple
    assert shape.byte_size == 8 + 4 + 2 + 4


def test_text_without_computations_raises_parse_error():
    with pytest.raises(hlo.HloParseError):
        hlo.parse_module("this is not HLO")


# ---------------------------------------------------------------- layout mismatch


def test_layout_copy_workload_reports_its_wrapped_copy():
    found = detect_layout_mismatch_copies(_modules("cpu_layout_copy_step"))
    assert len(found) == 1
    d = found[0]
    assert d.detector == "detect_layout_mismatch_copies"
    assert (d.module, d.instruction, d.inner_instruction, d.opcode) == (
        "cpu_layout_copy_step", "wrapped_copy", "copy.1", "copy")
    assert (d.input_shape, d.output_shape) == ("f32[2048,2048]{0,1}", "f32[2048,2048]{1,0}")
    assert (d.input_layout, d.output_layout) == ("{0,1}", "{1,0}")
    assert d.bytes == 16 * 2**20
    assert d.source == ""  # profiles carry no metadata
    assert "wrapped_copy" in d.description and "{0,1}" in d.description
    assert "cpu_layout_copy_step" in d.description


def test_device_put_into_column_major_is_a_layout_copy():
    (d,) = detect_layout_mismatch_copies(_modules("cpu_device_put_column_major"))
    assert (d.instruction, d.input_layout, d.output_layout) == ("wrapped_copy", "{1,0}", "{0,1}")


def test_materialised_transpose_reports_both_kernels():
    found = detect_layout_mismatch_copies(_modules("cpu_transpose_materialised"))
    assert [(d.instruction, d.inner_instruction, d.opcode) for d in found] == [
        ("wrapped_transpose", "transpose.0", "transpose"),
        ("wrapped_copy", "copy.1", "copy"),
    ]
    transpose = found[0]
    # dimensions={1,0} into layout {0,1}: the same bytes, only the layout label changes.
    assert (transpose.input_layout, transpose.output_layout) == ("{1,0}", "{0,1}")
    assert "physical no-op" in transpose.description
    assert transpose.source == "hlo_cases.py:7 (jit(transpose_materialised)/transpose)"


def test_transpose_copy_fusion_is_reported_by_its_copy():
    (d,) = detect_layout_mismatch_copies(_modules("cpu_transpose_copy_fusion"))
    assert (d.instruction, d.inner_instruction) == ("transpose_copy_fusion", "copy.1")
    assert (d.input_shape, d.output_shape) == ("f32[1024,1024]{0,1}", "f32[1024,1024]{1,0}")
    assert d.source == "hlo_cases.py:10 (jit(transpose_only)/transpose)"


def test_copy_into_the_layout_lapack_needs():
    (d,) = detect_layout_mismatch_copies(_modules("cpu_lu_after_matmul"))
    assert (d.instruction, d.inner_instruction) == ("copy_copy_fusion", "copy.5")
    assert (d.input_layout, d.output_layout) == ("{1,0}", "{0,1}")


def test_reshaping_movement_is_not_a_layout_copy():
    assert detect_layout_mismatch_copies(_modules("cpu_unfused_reshape_step")) == []
    assert detect_layout_mismatch_copies(_modules("cpu_head_split_metadata")) == []


def test_tpu_memory_space_copies_are_not_layout_changes():
    modules = _modules(
        "tpu_inference_2_jit_f", "tpu_inference_2_convert_element_type", "tpu_inference_2_psum")
    assert detect_layout_mismatch_copies(modules) == []


def test_small_copies_are_ignored():
    text = _text("cpu_layout_copy_step")
    small = text.replace("2048,2048", "64,64").replace("2048,128", "64,128")
    assert hlo.parse_shape("f32[64,64]{1,0}").byte_size < MIN_BYTES
    assert detect_layout_mismatch_copies({"small": small}) == []
    assert len(detect_layout_mismatch_copies({"big": text})) == 1


# ---------------------------------------------------------------- unfused reshapes


def test_unfused_reshape_workload_reports_the_chain_between_two_dots():
    (d,) = detect_unfused_reshapes(_modules("cpu_unfused_reshape_step"))
    assert d.detector == "detect_unfused_reshapes"
    assert (d.instruction, d.inner_instruction, d.opcode) == (
        "copy_bitcast_fusion", "transpose.0", "transpose")
    assert (d.input_shape, d.output_shape) == ("f32[2048,2048]{1,0}", "f32[65536,64]{1,0}")
    assert d.bytes == 16 * 2**20
    assert "ynn_fusion.1" in d.description and "ynn_fusion " in d.description
    assert "bitcast->transpose->copy->bitcast" in d.description


def test_unfused_reshape_source_from_metadata():
    (d,) = detect_unfused_reshapes(_modules("cpu_head_split_metadata"))
    assert d.instruction == "copy_bitcast_fusion"
    assert d.source == "hlo_cases.py:30 (jit(head_split_between_matmuls)/transpose)"


def test_two_movement_kernels_in_a_row_are_one_chain():
    (d,) = detect_unfused_reshapes(_modules("cpu_transpose_materialised"))
    assert d.instruction == "wrapped_transpose"
    assert "wrapped_transpose" in d.description and "wrapped_copy" in d.description
    assert "2 data-movement kernels" in d.description


def test_lone_layout_copy_is_left_to_the_layout_detector():
    # copy_copy_fusion sits between a dot and a custom call, but it is a pure relayout.
    assert detect_unfused_reshapes(_modules("cpu_lu_after_matmul")) == []
    assert detect_unfused_reshapes(_modules("cpu_layout_copy_step")) == []


# ---------------------------------------------------------------- convert -> reduce


def test_convert_reduce_workload_reports_the_materialised_convert():
    (d,) = detect_unnecessary_convert_reduce(_modules("cpu_convert_reduce_step"))
    assert d.detector == "detect_unnecessary_convert_reduce"
    assert (d.instruction, d.inner_instruction, d.opcode) == (
        "wrapped_convert", "convert_element_type.0", "convert->reduce")
    assert (d.input_shape, d.output_shape) == ("bf16[4096,4096]{1,0}", "f32[4096,4096]{1,0}")
    assert d.bytes == 64 * 2**20
    assert "ynn_fusion.1" in d.description and "1 more reduce" in d.description


def test_a_convert_fused_into_its_reduce_is_not_a_finding():
    # The f32 values never leave the kernel, and `jnp.sum(x, dtype=f32)` gives the same HLO:
    # the fusion boundary is respected.
    assert detect_unnecessary_convert_reduce(_modules("cpu_convert_reduce_fused")) == []


def test_convert_reduce_inside_a_scan_body():
    (d,) = detect_unnecessary_convert_reduce(_modules("cpu_scan_convert_reduce"))
    assert d.instruction == "dynamic-slice_convert_fusion"
    assert d.input_shape == "bf16[1,256,256]{2,1,0}"


def test_round_trip_convert_without_reduce_is_not_reported():
    found = detect_unnecessary_convert_reduce(_modules("cpu_multi_output_convert"))
    # wrapped_convert feeds two reduces; multiply_convert_fusion converts back to bf16.
    assert [d.instruction for d in found] == ["wrapped_convert"]


def test_integer_converts_are_not_reported():
    assert detect_unnecessary_convert_reduce(_modules("cpu_random_normal")) == []


# ---------------------------------------------------------------- all detectors


@pytest.mark.parametrize(
    "name",
    ["cpu_baseline_step", "cpu_host_bound_step", "cpu_memory_pressure_step", "cpu_random_normal",
     "tpu_inference_2_jit_f", "tpu_inference_2_psum", "tpu_inference_2_convert_element_type"],
)
def test_healthy_modules_trigger_no_detector(name):
    assert _all(_modules(name)) == {d.__name__: [] for d in DETECTORS}


def test_order_is_by_module_then_instruction_whatever_the_input_order():
    names = ["cpu_transpose_materialised", "cpu_layout_copy_step", "cpu_lu_after_matmul"]
    forward = detect_layout_mismatch_copies(_modules(*names))
    backward = detect_layout_mismatch_copies(_modules(*reversed(names)))
    assert forward == backward
    assert [(d.module, d.instruction) for d in forward] == [
        ("cpu_layout_copy_step", "wrapped_copy"),
        ("cpu_lu_after_matmul", "copy_copy_fusion"),
        ("cpu_transpose_materialised", "wrapped_transpose"),
        ("cpu_transpose_materialised", "wrapped_copy"),
    ]


def test_to_dict_is_json_ready_with_every_field():
    (d,) = detect_unfused_reshapes(_modules("cpu_unfused_reshape_step"))
    out = json.loads(json.dumps(d.to_dict()))
    assert set(out) == {
        "detector", "module", "instruction", "inner_instruction", "opcode", "input_shape",
        "output_shape", "input_layout", "output_layout", "bytes", "source", "description",
        "chain", "fused_with"}
    assert out["bytes"] == d.bytes
    assert out["chain"] == []  # one kernel; a chain lists its costly links


@pytest.mark.parametrize(
    "text",
    ["", "garbage", "{", "}", "HloModule m", "ENTRY e {\n  x = f32[ bad\n}",
     "ENTRY e {\n  ROOT t = (f32[2]{0}, s32[]) tuple(a, b)\n}",
     "ENTRY e {\n  c = f32[512,512]{0,1} copy(missing)\n}",
     "ENTRY e {\n  f = f32[512,512]{1,0} fusion(p), kind=kLoop, calls=nowhere\n}"],
)
def test_odd_text_never_crashes(text):
    assert _all({"odd": text}) == {d.__name__: [] for d in DETECTORS}


def test_truncated_real_modules_never_crash():
    for path in sorted(DATA.glob("*.hlo")):
        text = path.read_text()
        step = max(1, len(text) // 20)
        for cut in range(0, len(text), step):
            modules = {"head": text[:cut], "tail": text[cut:]}
            for detector in DETECTORS:
                assert isinstance(detector(modules), list)


def test_tpu_fixture_modules_from_xprof(tpu_logdir):
    from xprof.cli.xprof_cli import _wrap_with_logdir, cli_main

    tools = cli_main()
    run = next((tpu_logdir / "plugins" / "profile").iterdir())
    listed = json.loads(_wrap_with_logdir(tools["list_hlo_modules"])(str(run)))["modules"]
    get_text = _wrap_with_logdir(tools["get_hlo_text"])
    modules = {
        m: json.loads(get_text(str(run), module_name=m, max_lines=100000))["content"]
        for m in listed
    }
    assert any(m.startswith("jit_f(") for m in modules)
    for text in modules.values():
        assert hlo.parse_module(text).entry is not None
    assert _all(modules) == {d.__name__: [] for d in DETECTORS}


def test_async_copies_have_their_direction_from_memory_spaces():
    from mldiag.analysis.collection.hlo.facts import async_copies

    found = {c["copy_done"]: c["direction"] for c in async_copies(
        _modules("tpu_inference_2_jit_f"))}
    assert found == {"copy-done": "host→device", "copy-done.2": "host→device",
                     "copy-done.4": "host→device", "copy-done.1": "device→host",
                     "copy-done.3": "device→host", "copy-done.5": "device→host"}


def test_a_sum_and_a_max_of_one_f32_copy_get_their_own_fix():
    from mldiag.analysis.judgement.context import Context
    from mldiag.analysis.judgement.model import Hypothesis
    from mldiag.analysis.judgement.rules import convert_reduce

    (d,) = detect_unnecessary_convert_reduce(_modules("cpu_multi_output_convert"))
    assert "(reducers: add, maximum)" in d.description
    h = Hypothesis(category="convert_reduce", priority="P1", title="t", evidence=[],
                   impact={}, details={"detection": d.to_dict(),
                                       "tool": "detect_unnecessary_convert_reduce"})
    ctx = Context({"tools": {}}, None)  # type: ignore[arg-type]
    fix = convert_reduce.finding(h, ctx)["fix"]
    assert "jnp.max(x, axis=axis)" in fix and "sum-of-squares" not in fix


_FUSED_TRANSPOSE = _text("cpu_fused_transpose")


def test_a_transpose_fused_into_an_elementwise_consumer_is_a_layout_finding():
    (d,) = detect_layout_mismatch_copies({"jit_step(1)": _FUSED_TRANSPOSE})
    assert (d.instruction, d.inner_instruction) == ("add_tanh_fusion", "copy.1")
    assert d.fused_with == ("add", "tanh")
    assert d.source == "train.py:41 (jit(step)/transpose)"
    assert "inside the fusion that also computes add, tanh" in d.description
    # The same fusion without the transpose reorders nothing.
    plain = _FUSED_TRANSPOSE.replace("transpose(%param_1.2), dimensions={1,0}",
                                     "copy(%param_1.2)").replace("f32[512,512]{0,1} copy",
                                                                 "f32[512,512]{1,0} copy")
    assert detect_layout_mismatch_copies({"jit_step(1)": plain}) == []


def test_custom_calls_name_their_target_and_linalg_primitive():
    text = _text("cpu_eigh_custom_call")
    (c,) = custom_calls({"jit_step(1)": text})
    assert (c["instruction"], c["target"], c["linalg"]) == ("eigh.0", "lapack_ssyevd_ffi",
                                                            "eigh")
    assert c["source"] == "train.py:9 (jit(step)/jit(eigh)/eigh)"
    assert c["outputs_read"] == [1]  # the eigenvalues only: `eigvalsh` would do
