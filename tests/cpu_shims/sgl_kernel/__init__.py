"""Import-only sgl_kernel shim for the CPU test environment (see ../README.md).

Any attribute is a function that raises NotImplementedError when called.
"""
import importlib.abc
import importlib.machinery
import sys
import types


def _missing(name):
    def f(*a, **k):
        raise NotImplementedError(f"sgl_kernel CPU shim: {name} was called; no CPU kernel exists for it")

    f.__name__ = name.rsplit(".", 1)[-1]
    return f


class _Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__}.{name}")


# sgl_kernel.scalar_type is left unresolvable on purpose: SGLang then uses its own mock scalar types.
_NOT_SHIMMED = ("sgl_kernel.scalar_type",)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel.") and fullname not in _NOT_SHIMMED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Mod(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Mod
__version__ = "0.0.0+sglang-cpp-cpu-shim"
