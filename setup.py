"""Package list only (metadata lives in pyproject.toml).

`kernels/` is mapped to `sglang_pdd.kernels` so that no top-level `kernels` module is installed:
a PyPI package of that name is a dependency of sglang.
"""

from setuptools import find_packages, setup

kernel_pkgs = ["sglang_pdd.kernels"] + [f"sglang_pdd.kernels.{p}" for p in find_packages("kernels")]
setup(
    packages=find_packages(include=["sglang_pdd", "sglang_pdd.*"]) + kernel_pkgs,
    package_dir={"sglang_pdd.kernels": "kernels"},
)
