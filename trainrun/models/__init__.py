"""Model builders, one module each; each one's torch-free spec in ``specs/<name>.py``
(:func:`trainrun.models.build.build_model` builds the one a config names)."""
