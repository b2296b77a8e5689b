# The compiled fast path mirrors the pure-Python twin exactly: its types are the twin's.
from ._shed_py import ShedderCore as ShedderCore
