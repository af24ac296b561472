"""The aiohttp application keys the server's modules share (a module of its own, so that
``checkpoints.py`` and ``share.py`` read the config without importing ``app.py``)."""

from __future__ import annotations

from aiohttp import web

from .config import ServerConfig
from .rooms import Hub

CONFIG_KEY = web.AppKey("daisychain_config", ServerConfig)
HUB_KEY = web.AppKey("daisychain_hub", Hub)
