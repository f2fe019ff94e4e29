"""kiln's torch front end: `kiln.compile(module, example_inputs)` and the `torch.compile(m, backend="kiln")` backend
(`kiln.compile.backend`, found by torch through the `torch_dynamo_backends` entry point).

This package is itself callable, so `kiln.compile(...)` works whether `kiln.compile` names the package (once
imported) or the function.
"""

import sys
import types

from kiln.compile.module import CompiledModule, build_engine, compile


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs) -> CompiledModule:
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__call__ = compile  # for help() and introspection
__doc__ = __doc__ + "\n" + (compile.__doc__ or "")

__all__ = ["CompiledModule", "build_engine", "compile"]
