"""trainrun: fast, measured image-classifier training driven by YAML."""

__version__ = "0.1.0"
