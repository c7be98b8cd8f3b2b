"""Each task's torch-free spec (:class:`trainrun.kinds.TaskSpec`), one module per task module."""
