"""Tasks, one module each (``<name>.py``), on :mod:`trainrun.tasks.base`; each one's torch-free spec in
``specs/<name>.py``. Nothing here imports torch at package import, so the specs are read without it."""
