"""The one walk over the repository's files shared by scripts/check-structure.py and
scripts/check-format.py: sorted, on disk (so files not yet committed count too), skipping
.git, build trees (build/, build-*/, any folder holding CMakeCache.txt), generated/ folders
and tool caches, and never following links."""
import os

SKIP_DIRS = {".git", "generated", "__pycache__", "node_modules"}


def skip_dir(path, name):
    if name in SKIP_DIRS or name == "build" or name.startswith("build-"):
        return True
    return os.path.exists(os.path.join(path, name, "CMakeCache.txt"))


def walk(root):
    """Yields (relative path, absolute path) of every file under root, sorted."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not skip_dir(dirpath, d))
        for f in sorted(filenames):
            full = os.path.join(dirpath, f)
            if os.path.isfile(full) and not os.path.islink(full):
                yield os.path.relpath(full, root).replace(os.sep, "/"), full
