"""Data sources, loaders and stores; each source's torch-free spec in ``specs/<name>.py``
(:func:`trainrun.data.build.build_data` builds what a run reads)."""
