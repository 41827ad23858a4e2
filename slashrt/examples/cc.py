"""Connected components of a graph whose edges arrive in epochs, as a loop in a dataflow.

(The dataflow part follows once the loop API is merged.)
"""

from __future__ import annotations

from slashrt.examples._components import Components, ComponentsEpoch, canonical

__all__ = ["Components", "ComponentsEpoch", "canonical"]
