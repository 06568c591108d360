"""The official code's pure-Python modules, imported without running `mamba_ssm/__init__.py`: that file imports the CUDA
extensions, which a pure-Python wheel (bench/fetch_peers.sh) or a source checkout does not have. The package is
entered through a stand-in module that holds only its path; the submodules beneath it import as usual."""
import importlib
import importlib.util
import sys
import types


def official_attr(module: str, name: str):
    """`name` from `mamba_ssm.<module>`, e.g. `official_attr("modules.ssd_minimal", "ssd_minimal_discrete")`.
    Raises ModuleNotFoundError when no mamba_ssm package is on sys.path; the import's own error otherwise."""
    spec = importlib.util.find_spec("mamba_ssm")   # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mamba_ssm is not on sys.path")
    if "mamba_ssm" not in sys.modules:
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["mamba_ssm"] = pkg
    return getattr(importlib.import_module(f"mamba_ssm.{module}"), name)


def official_or_reason(module: str, name: str, missing: str):
    """`official_attr(module, name)`, or one line saying why it is unavailable: `missing` when no mamba_ssm package is
    found, the import's error otherwise (benchmarks report it and go on without the official code)."""
    try:
        return official_attr(module, name)
    except ModuleNotFoundError as e:
        if e.name is None or e.name == "mamba_ssm":
            return f"mamba_ssm unavailable: {missing}"
        return f"{name} unavailable: {type(e).__name__}: {e}"[:200]
    except Exception as e:
        return f"{name} unavailable: {type(e).__name__}: {e}"[:200]
