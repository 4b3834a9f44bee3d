"""The control plane installs under one import name of its own, `respawn_server`, while
the repository keeps the design card's folders (DESIGN §2): controlplane/ is the project
package itself, jobs/ and frontend/ its two apps. pyproject.toml has the rest; this file
only maps those folders, which a static package list would have to repeat package by package.
"""
from setuptools import find_packages, setup

ROOTS = {"respawn_server": "controlplane", "respawn_server.jobs": "jobs", "respawn_server.frontend": "frontend"}

packages = []
for name, folder in ROOTS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=ROOTS)
