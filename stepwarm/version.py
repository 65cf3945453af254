"""stepwarm's version, in a module of its own: read where ``stepwarm/__init__.py`` may not
have run (a folder named ``stepwarm`` in the current directory shadows the package as a
namespace package under an editable install, whose finder still serves its modules)."""

__version__ = "0.1.0"
