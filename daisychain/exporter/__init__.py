"""The exporter: trains a small torch network for each unit, verifies it over its whole
input domain, and writes ``luts/`` only from verified units."""
