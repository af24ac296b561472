"""The committed tables, their manifest, the one loader, and the exporter's --check."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from daisychain.exporter.train_units import UnitVerificationError, train_relu, verify
from daisychain.units import LutError, load_luts
from daisychain.units import reference as ref
from daisychain.units.golden import PATH as GOLDEN, build, dumps
from daisychain.units.luts import manifest_hash


def test_committed_tables_are_the_exact_definitions():
    luts = load_luts()
    for name, want in ref.exact_tables().items():
        assert np.array_equal(luts.tables()[name], want), name


def test_manifest_hash_covers_every_entry():
    m = load_luts().manifest
    assert m["manifest_sha256"] == manifest_hash(m["units"])
    for name, u in m["units"].items():
        changed = json.loads(json.dumps(m["units"]))
        changed[name]["sha256"] = "0" * 64
        assert manifest_hash(changed) != m["manifest_sha256"]


@pytest.mark.parametrize("name", ["mul.bin", "requantize.bin", "relu.bin"])
def test_flipped_byte_is_refused_naming_the_file(lut_copy, name):
    path = lut_copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(LutError, match=name.replace(".", r"\.") + ".*SHA-256"):
        load_luts(lut_copy)
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "export-luts", "--check",
                          "--out", str(lut_copy)], capture_output=True, text=True)
    assert out.returncode == 1
    assert name in out.stderr


def test_missing_table_and_bad_manifest(lut_copy):
    (lut_copy / "relu.bin").unlink()
    with pytest.raises(LutError, match="relu.bin: missing"):
        load_luts(lut_copy)
    (lut_copy / "manifest.json").write_text("{not json")
    with pytest.raises(LutError, match="manifest.json: not valid JSON"):
        load_luts(lut_copy)


def test_manifest_entry_cannot_point_outside(lut_copy):
    m = json.loads((lut_copy / "manifest.json").read_text())
    m["units"]["relu"]["file"] = "../relu.bin"
    m["manifest_sha256"] = manifest_hash(m["units"])
    (lut_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LutError, match="plain name"):
        load_luts(lut_copy)


def test_verification_refuses_a_unit_wrong_on_one_input(capsys):
    x = np.arange(-128, 128)
    table = ref.relu_exact(x).copy()
    table[200] += 1  # one wrong entry
    with pytest.raises(UnitVerificationError, match=r"wrong on 1 of 256 inputs; first "
                       r"counter-example: relu\(x=72\) gave 73, expected 72"):
        verify("relu", table, ref.relu_exact(x), lambda i: f"relu(x={i - 128})")


def test_trained_relu_is_reproducible():
    a, b = train_relu(0), train_relu(0)
    assert a.seed == b.seed and a.table.tobytes() == b.table.tobytes()
    assert np.array_equal(a.table, ref.relu_exact(np.arange(-128, 128)))


def test_export_check_passes_on_committed_tables():
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "export-luts", "--check"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OK, 4 tables match" in out.stdout  # mul, relu, requantize and exp


def test_golden_units_file_is_current():
    assert GOLDEN.read_text() == dumps(build()), "run `python -m daisychain.units.golden`"
