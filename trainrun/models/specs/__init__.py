"""Each model's torch-free spec (:class:`trainrun.kinds.KindSpec`), one module per model module."""
