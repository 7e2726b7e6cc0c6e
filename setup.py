"""The package list for setuptools (everything else is in pyproject.toml).

The code's packages are found, so a new one ships without a change here; conf/ (the Hydra configs, at
the top of the repository) goes into the package as harness/conf, where an installed harness finds
them (harness.config.CONF_DIR). pyproject.toml cannot say this: its packages.find cannot map a
directory into another package.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["harness", "harness.*", "kernels", "kernels.*", "models", "models.*"],
                                     exclude=["*.__pycache__"]) + ["harness.conf"],
    package_dir={"harness.conf": "conf"},
)
