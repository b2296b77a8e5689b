# The compiled map mirrors the pure-Python twin exactly: its types are the twin's.
from ._map_py import BreakerMap as BreakerMap
