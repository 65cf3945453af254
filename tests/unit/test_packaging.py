"""The wheel holds every stepwarm package: pyproject's explicit
``[tool.setuptools] packages`` list must name each folder that has an
``__init__.py`` (a package missing from it installs fine with ``pip install -e``
and is absent from a built wheel: ``import stepwarm`` then fails on the device)."""

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_wheel_list():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "stepwarm").rglob("__init__.py")}
    assert "stepwarm.blocks" in folders and "stepwarm.plan" in folders
    assert folders - listed == set()
    # the built-in scenarios ship from ./scenarios under the package name
    assert config["package-dir"]["stepwarm.scenarios"] == "scenarios"
    assert (ROOT / "scenarios" / "__init__.py").is_file()
