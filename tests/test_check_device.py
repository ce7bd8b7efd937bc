"""check(fn, device=...) / attnlab check --device: inputs on the device, the golden on the CPU, honest errors.

This machine has no GPU: the placement is tested on the CPU, by moving an adapter's inputs to torch's ``meta``
device (every array the call receives must land there), and the error paths with devices torch lacks here.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from zoo import numpy_zoo as npz
from zoo.torch_zoo import correct as torch_correct

from attnlab.checker import UsageError, check
from attnlab.checker.adapters import Adapter, Spec, TorchFramework
from attnlab.cli import main

CUDA = torch.cuda.is_available()


def _stable(report) -> dict:
    """The report's JSON without the timings."""
    d = report.as_dict()
    for key in ("seconds", "import_seconds", "summary"):
        d.pop(key)
    for p in d["probes"]:
        p.pop("seconds")
    return d


def test_device_cpu_gives_the_same_report_as_no_device_and_names_it():
    plain = check(F.scaled_dot_product_attention, gqa=True)
    on_cpu = check(F.scaled_dot_product_attention, gqa=True, device="cpu")
    via_object = check(F.scaled_dot_product_attention, gqa=True, device=torch.device("cpu"))
    assert plain.ok and on_cpu.ok, on_cpu.to_text()
    assert _stable(plain) == _stable(on_cpu) == _stable(via_object)
    assert on_cpu.spec["device"] == "cpu"
    assert (
        on_cpu.to_text().splitlines()[1]
        == "  torch on cpu, called as fn(q, k, v, attn_mask=, is_causal=, scale=, enable_gqa=)"
    )


def test_a_numpy_report_names_no_device():
    r = check(npz.correct, probes=("reference",))
    assert r.spec["device"] is None and r.to_text().splitlines()[1] == "  numpy, called as fn(q, k, v, mask=)"


@pytest.mark.parametrize("form", ["full", "batch", "key_padding", "valid_lens", "kv_cache", "varlen"])
def test_every_array_of_a_call_is_created_on_the_device(form):
    # the adapter's inputs sent to torch's meta device: q, k, v, the mask, lengths and cu_seqlens all land there
    adapter = Adapter(torch_correct, Spec(mask_form=form, device="cpu"))
    assert isinstance(adapter.fw, TorchFramework) and adapter.resolved.device == "cpu"
    adapter.fw.place = torch.device("meta")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 2, 3, 4)) for _ in range(3))
    mask = np.ones((2, 2, 3, 3), bool)
    mask[1, :, :, 2] = False
    args, kwargs = adapter.build_call(q, k, v, dtype="float32", mask=mask, causal=False, scale=None, gqa=False)
    arrays = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    assert len(arrays) == 4 + (form == "varlen")  # q, k, v and a mask; cu_seqlens_q and _k for varlen
    assert {a.device.type for a in arrays} == {"meta"}
    assert adapter.fw.floats(q, "bfloat16").dtype == torch.bfloat16


def test_outputs_come_back_to_the_cpu_for_the_float64_golden():
    seen = []

    def attention(q, k, v, mask=None):
        seen.append({str(x.device) for x in (q, k, v, mask) if x is not None})
        return torch_correct(q, k, v, None if mask is None else mask[:, None, None, :])  # mask [B, n_k]

    r = check(attention, device="cpu", mask_form="key_padding", probes=("reference", "padding"))
    assert not r.findings and r.verdict == "incomplete", r.to_text()  # masked-rows not selected
    assert seen and all(s == {"cpu"} for s in seen)


def _calls_counted():
    calls = []

    def attention(q, k, v, mask=None):
        calls.append(1)
        return torch_correct(q, k, v, mask)

    return attention, calls


#: A GPU kind this machine's torch does not have (cuda here; mps or xpu on a CUDA machine): no test is skipped.
MISSING = next(d for d in ("cuda", "mps", "xpu") if not getattr(torch, d).is_available())


def test_a_device_torch_does_not_have_is_a_usage_error_before_any_call():
    fn, calls = _calls_counted()
    with pytest.raises(UsageError, match=rf"^device: torch \S+ has no '{MISSING}' device here \(.*\); available: cpu"):
        check(fn, device=MISSING)
    assert calls == []


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("fpga", r"^device: torch \S+ has no 'fpga' device here \(.*\); available: cpu"),
        ("gpu0", r"^device: 'gpu0' is not a torch device \(.*\); available: cpu"),
        ("meta", r"^device: 'meta' tensors hold no data"),
        ("", r"^device: expected a device such as 'cuda'"),
        (3, r"^device: expected a device such as 'cuda'"),
    ],
)
def test_bad_devices_are_usage_errors_naming_the_option(device, message):
    fn, calls = _calls_counted()
    with pytest.raises(UsageError, match=message):
        check(fn, device=device)
    assert calls == []


def test_device_with_a_numpy_function_is_a_usage_error():
    with pytest.raises(UsageError, match=r"^device: 'cuda' applies to torch and JAX functions; a numpy function"):
        check(npz.correct, device="cuda")
    with pytest.raises(UsageError, match=r"^device: 'cpu' applies to torch and JAX functions"):
        check(npz.correct, device="cpu", framework="numpy")


def test_jax_functions_honour_jax_devices():
    import jax

    r = check(jax.nn.dot_product_attention, device="cpu", probes=("reference",), layout="bnhd")
    assert not r.findings, r.to_text()
    assert r.spec["device"] == "cpu:0" and " jax on cpu:0, called as" in r.to_text()
    with pytest.raises(UsageError, match=r"^device: JAX has no 'tpu' device here .*; available: cpu:0"):
        check(jax.nn.dot_product_attention, device="tpu")


class _Elsewhere(torch.Tensor):
    """A CPU tensor that says it lives on another device (what a function returning ``out.to("cuda:1")`` gives)."""

    @property
    def device(self):
        return torch.device("cuda", 1)


def test_an_output_on_another_device_is_an_output_type_finding():
    def moves_its_output(q, k, v, mask=None):
        return torch_correct(q, k, v, mask).as_subclass(_Elsewhere)

    r = check(moves_its_output, device="cpu", probes=("reference",))
    assert r.codes == ("output-type",), r.to_text()
    f = r.findings[0]
    assert f.message == (
        "your function returns the wrong kind of array: the output is on device cuda:1 but the inputs were on cpu; "
        "return it on the inputs' device (no .to(...) / .cpu() / device_put on the result)"
    )


def test_an_output_on_a_device_without_data_is_a_crash_naming_the_device():
    def to_meta(q, k, v, mask=None):
        return torch_correct(q, k, v, mask).to("meta")

    r = check(to_meta, probes=("reference",))
    assert "crash" in r.codes, r.to_text()
    f = next(f for f in r.findings if f.code == "crash")
    assert "the output is on device meta but the inputs were on cpu" in f.message
    assert "could not be read as an array" in f.message


def test_the_cli_takes_device_and_reports_a_missing_one_as_a_usage_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "kernel.py").write_text(
        textwrap.dedent(
            """
            from torch.nn.functional import scaled_dot_product_attention as attention
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "kernel.py:attention", "--device", "cpu", "--probes", "reference", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["device"] == "cpu" and data["framework"] == "torch" and not data["findings"]
    assert main(["check", "kernel.py:attention", "--device", "fpga"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab check: error: device: torch ") and "has no 'fpga' device here" in err
    assert "available: cpu" in err


def test_with_a_device_numpy_is_not_tried_when_every_call_fails():
    def broken(q, k, v, mask=None):
        torch.zeros(1)
        raise RuntimeError("boom")

    r = check(broken, device="cpu", probes=("reference",))
    assert "crash" in r.codes and r.framework == "torch"
    assert "numpy" not in r.detected, r.detected


#: Every device this machine's torch has: the CPU everywhere, the GPU where there is one (no test is skipped).
DEVICES = ["cpu"] + (["cuda"] if CUDA else []) + (["mps"] if torch.backends.mps.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_is_clean_on_every_device_here_and_its_inputs_are_on_it(device):
    seen = set()

    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        seen.update(str(x.device) for x in (q, k, v, attn_mask) if x is not None)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )

    r = check(attention, gqa=True, device=device)
    assert r.ok, r.to_text()
    placed = str(torch.empty(0, device=device).device)
    assert seen == {placed} and r.spec["device"] == placed
