# The compiled core mirrors the pure-Python twin exactly: its types are the twin's.
from ._breaker_py import CircuitBreaker as CircuitBreaker
from ._breaker_py import Config as Config
from ._breaker_py import Group as Group
from ._breaker_py import Metrics as Metrics

__all__ = ["CircuitBreaker", "Config", "Group", "Metrics"]
