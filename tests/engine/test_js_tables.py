"""The JS tables generated from the Python ones (engine/js_tables.py): the committed modules are
what the generator writes, so the page's setting ranges and task defaults are the commands'."""

from __future__ import annotations

from daisychain.engine import js_tables, settings
from daisychain.engine.settings import Range


def test_the_generated_js_tables_are_up_to_date():
    assert js_tables.main(["--check"]) == 0


def test_a_changed_python_range_makes_the_js_table_stale(monkeypatch, capsys):
    monkeypatch.setitem(settings.SETTINGS, "context", Range("int", 1, 512))
    assert "context: [\"int\", 1, 512, false]" in js_tables.settings_module()
    assert js_tables.main(["--check"]) == 1
    assert "settings_table.js is out of date" in capsys.readouterr().err


def test_a_changed_protocol_table_makes_the_js_protocol_stale(monkeypatch, capsys):
    from daisychain.peer import protocol_table

    monkeypatch.setitem(protocol_table.CONSTANTS, "MAX_RING", 2048)
    assert '"MAX_RING": 2048' in js_tables.protocol_module()
    assert js_tables.main(["--check"]) == 1
    assert "protocol_table.js is out of date" in capsys.readouterr().err
