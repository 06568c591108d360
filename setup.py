"""Packaging for mamba3_lite: metadata comes from settings.ini (nbdev 2 style), written by hand
because nbdev's template imports pkg_resources, which current setuptools no longer ships."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

requirements = cfg["requirements"].split()
requirements.append("triton; platform_system == 'Linux'")
extras = {
    "wandb": ["wandb"],
    "dev": cfg["dev_requirements"].split(),
    "data": cfg["data_requirements"].split(),
    "eval": cfg["eval_requirements"].split(),
    "tokenizers": cfg["tokenizers_requirements"].split(),
}
readme = Path(__file__).parent / "README.md"

setuptools.setup(
    name=cfg["repo"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=readme.read_text(encoding="utf-8") if readme.exists() else "",
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    url=cfg["git_url"],
    keywords=cfg["keywords"].split(),
    python_requires=">=" + cfg["min_python"],
    # the YAML configs ship inside the package as mamba3_lite/configs/*.yaml (importlib.resources finds them
    # in editable and wheel installs) while the repository keeps them at the top-level configs/
    packages=setuptools.find_packages(include=[cfg["lib_name"], cfg["lib_name"] + ".*"]) + [cfg["lib_name"] + ".configs"],
    package_dir={cfg["lib_name"] + ".configs": "configs"},
    package_data={cfg["lib_name"] + ".configs": ["*.yaml"]},
    include_package_data=True,
    install_requires=requirements,
    extras_require=extras,
    entry_points={
        "console_scripts": cfg["console_scripts"].split("\n") if cfg.get("console_scripts") else [],
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    zip_safe=False,
)
