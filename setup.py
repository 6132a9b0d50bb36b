"""Native kernels: every ``structspec/_native/*.c`` is built as ``structspec._native.<name>``
(with the shared ``*.h`` beside them).

They are optional (``optional=True``): where no C compiler is available the package still
installs, and each caller falls back to its NumPy path (see ``structspec._native``).
Everything else about the package is in ``pyproject.toml``.
"""

from pathlib import Path

import numpy
from setuptools import Extension, setup

_HERE = Path(__file__).parent
_NATIVE = _HERE / "structspec" / "_native"
_SOURCES = sorted(_NATIVE.glob("*.c"))
# Kernels that split their work over threads (OpenMP; the soname matches the libgomp torch
# loads, so both share one runtime).
_OPENMP = {"smallgemm": ["-fopenmp"], "attend": ["-fopenmp"], "qdot": ["-fopenmp"],
           "promptdot": ["-fopenmp"]}
_HEADERS = [str(h.relative_to(_HERE)) for h in sorted(_NATIVE.glob("*.h"))]  # shared by all

setup(
    ext_modules=[
        Extension(
            f"structspec._native.{src.stem}",
            [str(src.relative_to(_HERE))],
            depends=_HEADERS,
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O3", *_OPENMP.get(src.stem, [])],
            extra_link_args=_OPENMP.get(src.stem, []),
            optional=True,
        )
        for src in _SOURCES
    ],
)
