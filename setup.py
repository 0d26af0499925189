"""
What `pip install .` adds to pyproject.toml: the folders the repo ships beside the package, installed inside it
as package data, so the commands and the app find them outside the repo (arr_coc.checkpoints.shipped):

    checkpoints/  ->  arr_coc/shipped/checkpoints/   the trained ARR layers (--checkpoint tiny-text-vs-distractor)
    models/       ->  arr_coc/shipped/models/        the offline model (models/pocket-qwen2-vl, --model pocket)

    pip install .            # then, from any folder: python -m arr_coc.run --checkpoint tiny-text-vs-distractor ...
"""

from pathlib import Path

from setuptools import find_packages, setup

SHIPPED = ("checkpoints", "models")  # repo folders installed as arr_coc/shipped/<name> (see arr_coc/checkpoints.py)

here = Path(__file__).resolve().parent
folders = [name for name in SHIPPED if (here / name).is_dir()]
setup(
    packages=find_packages(include=["arr_coc", "arr_coc.*"]) + [f"arr_coc.shipped.{name}" for name in folders],
    package_dir={f"arr_coc.shipped.{name}": name for name in folders},
    package_data={f"arr_coc.shipped.{name}": ["**/*"] for name in folders}  # every file, at any depth
    | {"arr_coc.synth": ["fonts/*"]},  # the DejaVu faces the layout families draw with (synth/families.py)
)
