"""Names a package resolves on first use (PEP 562 module `__getattr__`): `import vitfast` stays light, and a layer's
package can name what sits in its submodules without importing them (and what they import) up front."""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Dict, Optional, Tuple


def lazy_attributes(package: str, names: Dict[str, Tuple[str, Optional[str]]]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: `names[name] = (module, attribute)` imports `module` (relative to `package`
    when it starts with a dot) on the first access and returns its `attribute` (the module itself for None); the
    value is then stored in the package, so later accesses are plain attribute reads."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, attribute = names[name]
        module = importlib.import_module(module_name, package)
        value = module if attribute is None else getattr(module, attribute)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
