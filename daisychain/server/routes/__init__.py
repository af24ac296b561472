"""The HTTP routes by resource: ``/data`` (data.py), ``/datasets`` and uploads (datasets.py),
``/datasets/hub`` (hub.py), ``/checkpoints`` (checkpoints.py), ``/share`` (share.py). The page,
``/healthz`` and the signaling socket are ``server/app.py``'s."""
