"""Run a script as on the lent GPU machines, where JAX is installed but TensorFlow is not.

`site_view(dir)` fills `dir` with links to every entry of this environment's site-packages
except TensorFlow, tensorflow_text and seqio; `command(view, script, *args)` is the argv that
runs `script` with `python -S` (no site-packages) and only the project and that view on its
path, so `import tensorflow` fails there as it does on those machines.
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN = ("tensorflow", "tensorflow_text", "seqio")


def site_view(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    for source in {sysconfig.get_paths()["purelib"], *site.getsitepackages()}:
        for name in os.listdir(source):
            top = name.split("-")[0].split(".")[0].lower()
            if top in HIDDEN or name.startswith(HIDDEN) or os.path.exists(os.path.join(directory, name)):
                continue
            os.symlink(os.path.join(source, name), os.path.join(directory, name))
    return directory


def command(view: str, script: str, *args: str) -> list[str]:
    code = ("import runpy, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; sys.argv = sys.argv[3:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    return [sys.executable, "-S", "-c", code, ROOT, view, script, *args]
