"""The YAML training configs, shipped inside the package as `mamba3_lite.configs` (see setup.py)."""
