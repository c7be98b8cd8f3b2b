"""Each data source's torch-free spec (:class:`trainrun.kinds.KindSpec`), one module per source module."""
