"""The exp unit (the transformer's softmax, docs/ENGINE.md "The exp unit"): trained and
verified on all 256 inputs by the exporter, in luts/ and the manifest, covered by
``export-luts --check``, and a flipped byte in its table is caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from daisychain.exporter.train_exp import train_exp
from daisychain.exporter.train_units import UnitVerificationError, verify
from daisychain.units import reference as ref
from daisychain.units.luts import LutError, default_dir, load_luts


def test_exp_definition():
    t = ref.exp_table_exact()
    z = np.arange(-128, 128)
    assert t.shape == (256,) and t[128] == 32768 and np.all(t[z > 0] == 32768)
    assert np.all(np.diff(t[:129]) >= 0) and t[0] == 11  # exp(-8) * 32768 = 10.99
    got = np.floor(32768 * np.exp(np.minimum(z, 0) / 16) + 0.5)  # a float check of the decimal one
    assert np.array_equal(got, t)


def test_committed_exp_table_is_the_definition_and_in_the_manifest():
    luts = load_luts()
    assert np.array_equal(luts.exp, ref.exp_table_exact())
    m = json.loads((default_dir() / "manifest.json").read_text())
    assert m["extra_units"]["exp"]["file"] == "exp.bin"
    assert luts.exp_sha256 == m["extra_units"]["exp"]["sha256"]
    # the core units' hash is unchanged: runs without a transformer keep their identity
    assert luts.manifest_sha256 == "69f8d4040092b35b511ac95b76052b125c57105ceafceec03c4103c2684de975"


def test_trained_exp_is_exact_and_reproducible():
    a, b = train_exp(0), train_exp(0)
    assert a.table.tobytes() == b.table.tobytes()
    assert np.array_equal(a.table, ref.exp_table_exact())


def test_exp_verification_names_the_counter_example():
    t = ref.exp_table_exact().copy()
    t[100] += 1
    with pytest.raises(UnitVerificationError, match=r"exp: wrong on 1 of 256 inputs; first "
                       r"counter-example: exp\(z=-28\)"):
        verify("exp", t, ref.exp_table_exact(), lambda i: f"exp(z={i - 128})")


def test_flipped_byte_in_exp_table_is_caught(tmp_path):
    d = tmp_path / "luts"
    shutil.copytree(default_dir(), d)
    raw = bytearray((d / "exp.bin").read_bytes())
    raw[4 * 60] ^= 0x01
    (d / "exp.bin").write_bytes(bytes(raw))
    with pytest.raises(LutError, match="exp.bin: SHA-256"):
        load_luts(d)
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "export-luts", "--check",
                          "--out", str(d)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "exp.bin" in out.stderr


def test_manifest_without_the_exp_unit_is_refused(tmp_path):
    d = tmp_path / "luts"
    shutil.copytree(default_dir(), d)
    m = json.loads((d / "manifest.json").read_text())
    del m["extra_units"]
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LutError, match="extra units"):
        load_luts(d)
