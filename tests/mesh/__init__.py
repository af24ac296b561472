"""Mesh tier: real daisy-peer processes over real aiortc data channels."""
